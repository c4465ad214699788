"""`gpuclass-hooks check`: call a running service's hook the way Metacontroller does, and say
whether it answers. The chart's `helm test` Pod runs it against the release's Service.

One customize call for a GPUClass (it reads nothing and writes nothing): with the token it must
be answered 200 with the related resources; with a token file given, the same call without the
token must be refused 401, so that a service that accepts anyone fails the check. Standard
library only: the image carries nothing else for it.
"""

from __future__ import annotations

import errno
import http.client
import json
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

CUSTOMIZE_PATH = "/status/customize"
CUSTOMIZE_REQUEST = {
    "controller": {"kind": "CompositeController", "metadata": {"name": "gpuclass-status"}},
    "parent": {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": "helm-test", "uid": "helm-test"},
        "spec": {"resourceName": "nvidia.com/helm-test"},
    },
}


@dataclass(frozen=True)
class Target:
    base_url: str  # scheme://host:port of the hooks
    ca_file: Path | None = None
    token_file: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    timeout_seconds: float = 10
    # A Service routes to a pod a moment after the pod is Ready (kube-proxy's next sync): until
    # then a connection is refused or unreachable. And a Service made moments earlier may not
    # resolve yet: the cluster's DNS answers a name it has not seen as missing, and caches that
    # answer for seconds. Those are retried this long; nothing else is.
    reach_seconds: float = 0


def _call(target: Target, token: str | None) -> tuple[int, bytes]:
    parts = urlsplit(target.base_url)
    host, port = parts.hostname, parts.port
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError(f"{target.base_url} is not an http:// or https:// URL with a host")
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=str(target.ca_file) if target.ca_file else None)
        if target.client_cert:
            # Without a key file, the key is in the certificate's file.
            key = str(target.client_key) if target.client_key else None
            context.load_cert_chain(str(target.client_cert), key)
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=target.timeout_seconds, context=context
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=target.timeout_seconds)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request("POST", CUSTOMIZE_PATH, json.dumps(CUSTOMIZE_REQUEST).encode(), headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


NOT_YET_ROUTED = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)
NOT_YET_RESOLVED = (socket.EAI_AGAIN, socket.EAI_NONAME)


def _not_yet_reachable(error: OSError) -> bool:
    if isinstance(error, socket.gaierror):
        return error.errno in NOT_YET_RESOLVED
    return error.errno in NOT_YET_ROUTED


def _first_call(target: Target, token: str | None) -> tuple[int, bytes]:
    """The first call, again while the service is not yet reachable or its name not yet known,
    for reach_seconds."""
    deadline = time.monotonic() + target.reach_seconds
    while True:
        try:
            return _call(target, token)
        except OSError as error:
            if not _not_yet_reachable(error) or time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def check(target: Target) -> list[str]:
    """What went wrong, one line each; empty when the service answered as it must. Lines name
    the status, never the token."""
    token = target.token_file.read_text().strip() if target.token_file else None
    problems = []
    try:
        status, body = _first_call(target, token)
        if status != 200:
            problems.append(f"{CUSTOMIZE_PATH} with the token: HTTP {status}, expected 200")
        elif "relatedResources" not in json.loads(body):
            problems.append(f"{CUSTOMIZE_PATH}: the answer has no relatedResources")
        if token is not None:
            refused, _ = _call(target, None)
            if refused != 401:
                problems.append(f"{CUSTOMIZE_PATH} without a token: HTTP {refused}, expected 401")
    except (OSError, ValueError) as error:  # refused, TLS, timeout, an answer that is not JSON
        problems.append(f"{CUSTOMIZE_PATH}: {type(error).__name__}: {error}")
    return problems
