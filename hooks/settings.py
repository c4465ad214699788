"""The one Settings object, read from the environment (prefix GPUCLASS_) once at start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from hooks.rules.selectors import SelectorError, parse_selector
from hooks.wire.metacontroller import LabelSelector
from hooks.wire.names import DNS_LABEL_PATTERN, is_dns_label

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUCLASS_", frozen=True, extra="ignore")

    enabled: bool = True
    kubevirt_namespace: Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)] = (
        "cozy-kubevirt"
    )
    kubevirt_name: Annotated[str, Field(min_length=1, max_length=253)] = "kubevirt"
    node_selector: str = ""
    pod_selector: str = ""
    kube_api: str | None = None
    kube_token_file: Path = SERVICE_ACCOUNT / "token"
    kube_ca_file: Path = SERVICE_ACCOUNT / "ca.crt"
    kube_timeout_seconds: Annotated[float, Field(gt=0, le=30)] = 3.0
    kubevirt_cache_seconds: Annotated[float, Field(ge=0, le=60)] = 5.0
    vgpu_namespace_label: Annotated[str, Field(min_length=1, max_length=317)] = (
        "namespace.cozystack.io/vgpu"
    )
    license_namespaces: Annotated[tuple[str, ...], NoDecode] = ("cozy-gpu-operator",)
    auth_token_file: Path | None = None
    metrics_require_auth: bool = False
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    # Above the largest cluster the benchmark generates (2,000 nodes, 60,000 pods: ~540 MB).
    max_body_bytes: Annotated[int, Field(ge=1024)] = 1024**3
    shutdown_delay_seconds: Annotated[float, Field(ge=0, le=60)] = 5.0
    admission_cache_seconds: Annotated[float, Field(ge=0, le=60)] = 5.0
    # The memory budget for request bodies in flight (hooks.memory). Unset: derived from the
    # container's memory limit (memory_limit_bytes, which the chart passes through the downward
    # API, else the cgroup's); no limit, no budget. 0 turns it off.
    memory_budget_bytes: Annotated[int, Field(ge=0)] | None = None
    memory_limit_bytes: Annotated[int, Field(gt=0)] | None = None
    # How long a call waits for the budget; below Metacontroller's hook timeout (30 s in the chart).
    memory_wait_seconds: Annotated[float, Field(gt=0, le=60)] = 20.0

    @model_validator(mode="after")
    def _tls_files_go_together(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("GPUCLASS_TLS_CERT_FILE and GPUCLASS_TLS_KEY_FILE go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("GPUCLASS_TLS_CLIENT_CA_FILE needs GPUCLASS_TLS_CERT_FILE")
        return self

    @field_validator("node_selector", "pod_selector")
    @classmethod
    def _selector_parses(cls, value: str) -> str:
        try:
            parse_selector(value)
        except SelectorError as error:
            raise ValueError(str(error)) from None
        return value

    @field_validator("kube_api")
    @classmethod
    def _api_is_http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/") if value else None

    @field_validator("license_namespaces", mode="before")
    @classmethod
    def _split_namespaces(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("license_namespaces")
    @classmethod
    def _namespaces_are_labels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one namespace is required")
        for namespace in value:
            if not is_dns_label(namespace):
                raise ValueError(f"{namespace!r} is not a namespace name")
        return value

    @property
    def node_label_selector(self) -> LabelSelector | None:
        return parse_selector(self.node_selector)

    @property
    def pod_label_selector(self) -> LabelSelector | None:
        return parse_selector(self.pod_selector)

    @property
    def default_license_namespace(self) -> str:
        return self.license_namespaces[0]

    def api_base_url(self) -> str | None:
        """The API server: the setting, else in-cluster from the service environment."""
        if self.kube_api:
            return self.kube_api
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            return None
        host = f"[{host}]" if ":" in host else host
        return f"https://{host}:{port}"


def describe_error(error: ValidationError) -> str:
    """One line naming the environment variable, for a service that refuses to start."""
    first = error.errors(include_url=False, include_input=False)[0]
    message = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:
        return f"invalid settings: {message}"
    return f"invalid setting GPUCLASS_{str(first['loc'][0]).upper()}: {message}"
