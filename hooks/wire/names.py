"""Kubernetes name rules, once: what the API server accepts as a name, a label value, a key."""

from __future__ import annotations

import re

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_LABEL = re.compile(DNS_LABEL_PATTERN)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def is_dns_label(name: str) -> bool:
    """A DNS-1123 label: namespaces, GPUClass names."""
    return len(name) <= 63 and _DNS_LABEL.match(name) is not None


def is_dns_subdomain(name: str) -> bool:
    """A DNS-1123 subdomain: most object names, resource-name domains."""
    return len(name) <= 253 and _DNS_SUBDOMAIN.match(name) is not None


def is_label_value(value: str) -> bool:
    """A label value: at most 63 characters, possibly empty; the license copies' class label."""
    return len(value) <= 63 and _LABEL_VALUE.match(value) is not None


def namespaced_key(namespace: str, name: str) -> str:
    """`namespace/name`: how Metacontroller keys a namespaced object of a cluster-wide parent."""
    return f"{namespace}/{name}"
