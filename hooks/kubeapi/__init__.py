"""The Kubernetes edge: everything the service reads from the API server itself.

`client` makes the GETs; `kubevirt` reads the KubeVirt CR for the status hook; `budget` reads the
inputs of the GPU budget webhook. A failed read is always `client.Unreadable`, whose message the
reader prefixes with what it was reading.
"""
