"""The one Settings object, read from the environment (prefix GPUCLASS_) once at start."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from hooks.rules.selectors import SelectorError, parse_selector
from hooks.wire.metacontroller import LabelSelector
from hooks.wire.names import DNS_LABEL_PATTERN, is_dns_label, is_dns_subdomain

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ENV_PREFIX = "GPUCLASS_"
# What a call leaves its caller for the answer's way back: a second, or a tenth of a short wait.
ANSWER_MARGIN_SECONDS = 1.0


def setting(
    default: Any,
    description: str,
    *,
    chart: str | None = None,
    not_in_chart: str | None = None,
    shown: str | None = None,
    **constraints: Any,
) -> Any:
    """A setting, declared once: its default, what it means (the README's settings table is
    generated from it), and either the chart value it follows (`chart`, a dotted path in
    values.yaml that the Deployment turns into this variable, or one of Helm's own objects such as
    `Release.Namespace`) or why the chart deliberately sets nothing (`not_in_chart`). `shown` is
    how the default reads where the value alone says too little."""
    if (chart is None) == (not_in_chart is None):
        raise TypeError("a setting names its chart value or says why it has none")
    return Field(
        default,
        description=description,
        json_schema_extra={"chart": chart, "not_in_chart": not_in_chart, "shown": shown},
        **constraints,
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    enabled: bool = setting(
        True,
        'GPU features on or off. Off: `/status/sync` answers `{"status": {}, "children": []}` '
        "(computed status cleared) and `/status/customize` asks for no Nodes or Pods.",
        chart="gpu.enabled",
    )
    dra_api: bool = setting(
        True,
        "the API server serves `resource.k8s.io/v1`: DRA classes relate ResourceSlices, "
        "ResourceClaims and their DeviceClass only then (off, they say `DRANotEnabled`)",
        chart="dra.api",
    )
    dra_device_taint_rules: bool = setting(
        False,
        "the API server serves DeviceTaintRules (`resource.k8s.io/v1beta2`, gate "
        "`DRADeviceTaintRules`): DRA classes relate them and leave out the devices they taint "
        "(off, only the slices' own taints count)",
        chart="dra.deviceTaintRules",
    )
    kubevirt_namespace: str = setting(
        "cozy-kubevirt",
        "namespace of the KubeVirt CR",
        chart="kubevirt.namespace",
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
    )
    kubevirt_name: str = setting(
        "kubevirt", "name of the KubeVirt CR", chart="kubevirt.name", min_length=1, max_length=253
    )
    node_selector: str = setting(
        "",
        "label selector in kubectl syntax (`a=b,c!=d,e in (x,y),f,!g`) for the Nodes "
        "Metacontroller sends",
        chart="selectors.nodes",
        shown="empty (all)",
    )
    pod_selector: str = setting(
        "", "the same for Pods", chart="selectors.pods", shown="empty (all)"
    )
    kube_api: str | None = setting(
        None,
        "API server base URL, for the KubeVirt read and the budget webhook's reads",
        not_in_chart="in a pod the service account's in-cluster address is right",
        shown="in-cluster (`https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`)",
    )
    kube_token_file: Path = setting(
        SERVICE_ACCOUNT / "token",
        "bearer token, re-read on every read (it rotates); no file, no header",
        not_in_chart="the service account's projected token",
    )
    kube_ca_file: Path = setting(
        SERVICE_ACCOUNT / "ca.crt",
        "CA of the API server; plain `http://` URLs need none",
        not_in_chart="the service account's CA",
    )
    kube_timeout_seconds: float = setting(
        3.0,
        "timeout of each API read",
        not_in_chart="a property of the API server, not of the install",
        gt=0,
        le=30,
    )
    kube_read_max_bytes: int = setting(
        64 * 1024 * 1024,
        "what the API reads in flight in one worker may hold together, decompressed: a read past "
        "it fails as unreadable, naming it, and nothing more of it is held (a page of the largest "
        "list the hooks read is a few megabytes); the derived memory budget leaves it aside",
        chart="maxApiReadBytes",
        ge=1024 * 1024,
    )
    kubevirt_cache_seconds: float = setting(
        5.0,
        "how long a KubeVirt read that found the CR (or found it absent) answers every class sync; "
        "a failed read is not kept, and concurrent syncs share the read in flight",
        not_in_chart="short next to the status resync; nothing to tune per install",
        ge=0,
        le=60,
    )
    vgpu_namespace_label: str = setting(
        "namespace.cozystack.io/vgpu",
        'a namespace is entitled to license copies when this label\'s value is exactly `"true"`',
        chart="license.namespaceLabel",
        min_length=1,
        max_length=317,
    )
    license_namespaces: Annotated[tuple[str, ...], NoDecode] = setting(
        ("cozy-gpu-operator",),
        "comma-separated namespaces a license source Secret may live in; the first is the "
        "default when `secretRef.namespace` is omitted. A class naming any other namespace gets "
        "no copies and shows `LicenseSecretMissing` / `NamespaceNotAllowed` (a class must not be "
        "able to copy an arbitrary Secret into tenant namespaces)",
        chart="license.namespaces",
    )
    auth_token_file: Path | None = setting(
        None,
        "when set, every hook route requires `Authorization: Bearer <token>`; the file lists "
        "accepted tokens one per line and is re-read when it changes",
        chart="auth.enabled",
    )
    metrics_require_auth: bool = setting(
        False, "put `/metrics` behind the same token", chart="metrics.requireAuth"
    )
    tls_cert_file: Path | None = setting(
        None, "with `GPUCLASS_TLS_KEY_FILE`: `serve` speaks HTTPS only", chart="tls.enabled"
    )
    tls_key_file: Path | None = setting(
        None, "the key of `GPUCLASS_TLS_CERT_FILE`", chart="tls.enabled"
    )
    tls_client_ca_file: Path | None = setting(
        None,
        "require client certificates signed by this CA (Metacontroller's `clientTLS`)",
        chart="tls.clientAuth.enabled",
    )
    max_body_bytes: int = setting(
        1024**3,
        "larger bodies get 413 without being read (a chunked body that reaches the limit is "
        "refused too); above the largest cluster the benchmark generates "
        "(see [scale](docs/scale.md))",
        chart="maxBodyBytes",
        shown="`1073741824` (1 GiB)",
        ge=1024,
    )
    admission_max_body_bytes: int = setting(
        7 * 1024**2,
        "larger admission review bodies get 413 at once, before anything is reserved (a review "
        "holds at most the two objects the API server accepted; controller-runtime's limit)",
        not_in_chart="the API server's own object size limit bounds what a review holds",
        shown="`7340032` (7 MiB)",
        ge=1024,
    )
    admission_memory_bytes: int = setting(
        32 * 1024**2,
        "the admission port's share of the memory budget: bytes of review bodies held at once, "
        "counted as they arrive (never by the length declared) until the review is answered; "
        "past it the oldest bodies still arriving are dropped (see docs/scale.md)",
        not_in_chart="a few of the largest reviews at once; the derived memory budget leaves it "
        "aside",
        shown="`33554432` (32 MiB)",
        ge=1024**2,
    )
    header_timeout_seconds: float = setting(
        10.0,
        "how long a connection has, from accept, to complete its TLS handshake, request line and "
        "headers (Go's `ReadHeaderTimeout`); then it is closed. Until then it holds no thread",
        not_in_chart="callers on the cluster network send a head in milliseconds",
        gt=0,
        le=60,
    )
    max_connections: int = setting(
        10000,
        "open connections per worker process; past it, the oldest that have not finished their "
        "head are dropped first, then the oldest idle ones, never a call in progress",
        not_in_chart="bounded by the file descriptors of the pod, not by the install",
        ge=16,
    )
    log_level: Literal["debug", "info", "warning", "error"] = setting(
        "info",
        "the least severe log lines written (debug, info, warning, error), the serving "
        "stack's (gunicorn's) included; one JSON line each",
        chart="logLevel",
    )
    shutdown_delay_seconds: float = setting(
        5.0,
        "on SIGTERM, how long readiness reports 503 before gunicorn stops accepting",
        not_in_chart="tied to how fast endpoints drop a pod, not to the install",
        ge=0,
        le=60,
    )
    admission_timeout_seconds: float = setting(
        10.0,
        "how long the API server waits for a budget review (the webhook's `timeoutSeconds`): a "
        "review is answered within it less a margin, a verdict or a denial naming the read that "
        "did not finish",
        chart="admission.timeoutSeconds",
        ge=1,
        le=30,
    )
    platform_values_secret: str = setting(
        "cozystack-values",
        "the platform's own values Secret, which Cozystack's API names in every HelmRelease's "
        "`valuesFrom` and which sets nothing a GPU budget reads (`_`-prefixed keys only): a "
        "reference to it at the top, or at a path outside what the budgets read, is not an "
        "unreadable input",
        chart="admission.platformValuesSecret",
    )
    gpu_instance_types: Annotated[tuple[str, ...], NoDecode] = setting(
        ("gn1.xlarge", "gn1.2xlarge", "gn1.4xlarge", "gn1.8xlarge"),
        "the cluster instance types that attach GPUs, comma-separated, as the chart's webhook "
        "match conditions name them: a VM naming one reaches the webhook though it lists no "
        "gpus entries. The budget report counts what every instance type attaches and says "
        "which ones attach GPUs without being named here",
        chart="admission.gpuInstanceTypes",
        shown="gn1.xlarge,gn1.2xlarge,gn1.4xlarge,gn1.8xlarge",
    )
    admission_cache_seconds: float = setting(
        5.0,
        "how long the budget webhook caches GPUClasses (tenant declarations and reservations "
        "are never cached)",
        chart="admission.cacheSeconds",
        ge=0,
        le=60,
    )
    memory_budget_bytes: int | None = setting(
        None,
        "bytes of request bodies in flight, each counted 1.5x its size plus 48 MiB (see "
        "docs/scale.md); unset: the memory limit less min(256 MiB, half the limit); `0`: no "
        "budget",
        chart="memoryBudget.bytes",
        shown="derived",
        ge=0,
    )
    memory_limit_bytes: int | None = setting(
        None,
        "the container's memory limit, which the chart passes through the downward API; "
        "unset: cgroup v2 `memory.max`, else v1 `memory.limit_in_bytes`; no limit anywhere: "
        "no budget",
        chart="resources.limits.memory",
        shown="the cgroup's",
        gt=0,
    )
    hook_timeout: str = setting(
        "30s",
        "how long a caller waits for a hook's answer, as a Go duration (`30s`, `90s`, `2m`; the "
        "chart's `controllers.hookTimeout` takes one unit, `ms`, `s` or `m`): a body "
        "is read, and a large call computed, within it (then 408 or 500; the caller has given "
        "up)",
        chart="controllers.hookTimeout",
    )
    status_resync_seconds: float = setting(
        60.0,
        "the status controller's resync period: a class's metrics are dropped three periods "
        "after its last sync",
        chart="controllers.statusResyncPeriodSeconds",
        gt=0,
    )
    budget_classes_namespace: str = setting(
        "cozy-gpu",
        "namespace of the class index the budget report reads (a ConfigMap "
        "`gpuclass-budget-classes` Metacontroller writes there): the chart sets the release's",
        chart="Release.Namespace",
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
    )
    budget_report_resync_seconds: float = setting(
        600.0,
        "the budget report's resync period: a pool's metrics are dropped three periods after "
        "its last report",
        chart="controllers.budgetReportResyncPeriodSeconds",
        gt=0,
    )
    body_timeout_seconds: float = setting(
        10.0,
        "how long a request body may take besides what its size needs at "
        "`GPUCLASS_BODY_MIN_BYTES_PER_SECOND`: a client that sends slower is answered 408, and "
        "what it held is released",
        not_in_chart="callers on the cluster network send far faster; nothing to tune per install",
        gt=0,
        le=300,
    )
    body_min_bytes_per_second: int = setting(
        8 * 1024**2,
        "the slowest a request body may arrive, past `GPUCLASS_BODY_TIMEOUT_SECONDS`",
        not_in_chart="callers on the cluster network send far faster; nothing to tune per install",
        shown="`8388608` (8 MiB/s)",
        gt=0,
    )
    memory_wait_seconds: float = setting(
        20.0,
        "how long a call waits for the memory budget before it gets 429 with `Retry-After` "
        "(keep it below the hook timeout)",
        chart="memoryBudget.waitSeconds",
        gt=0,
        le=60,
    )

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

    @field_validator("hook_timeout")
    @classmethod
    def _is_go_duration(cls, value: str) -> str:
        go_duration_seconds(value)
        return value

    @field_validator("kube_api")
    @classmethod
    def _api_is_http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/") if value else None

    @field_validator("platform_values_secret")
    @classmethod
    def _is_object_name(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(f"{value!r} is not a Secret name")
        return value

    @field_validator("gpu_instance_types")
    @classmethod
    def _instance_types_are_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not is_dns_subdomain(name):
                raise ValueError(f"{name!r} is not an instance type name")
        return value

    @field_validator("license_namespaces", "gpu_instance_types", mode="before")
    @classmethod
    def _split_lists(cls, value: object) -> object:
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
    def hook_timeout_seconds(self) -> float:
        return go_duration_seconds(self.hook_timeout)

    def answer_within_seconds(self, caller: str) -> float:
        """How long a call has, from when the edge took it, to be answered: what its caller
        waits (the API server for admission reviews, Metacontroller for every other hook) less
        a margin for the answer's way back."""
        waits = (
            self.admission_timeout_seconds if caller == "apiserver" else self.hook_timeout_seconds
        )
        return waits - min(ANSWER_MARGIN_SECONDS, waits / 10)

    def body_deadline_seconds(self, length: int) -> float:
        """How long a body of this many bytes may take to arrive: what its size needs at the
        minimum rate, plus the body timeout, and never past the hook timeout."""
        allowed = self.body_timeout_seconds + length / self.body_min_bytes_per_second
        return min(allowed, self.hook_timeout_seconds)

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


_GO_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(h|ms|m|s))+")
_GO_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def go_duration_seconds(text: str) -> float:
    """Seconds of a positive Go duration such as Metacontroller's hook timeouts: `30s`, `1m30s`,
    `1.5h`."""
    if not _GO_DURATION.fullmatch(text):
        raise ValueError("must be a Go duration such as 30s or 1m30s")
    seconds = sum(
        float(number) * _GO_UNIT_SECONDS[unit]
        for number, unit in re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", text)
    )
    if seconds <= 0:
        raise ValueError("must be longer than zero")
    return seconds


def describe_error(error: ValidationError) -> str:
    """One line naming the environment variable, for a service that refuses to start."""
    first = error.errors(include_url=False, include_input=False)[0]
    message = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:
        return f"invalid settings: {message}"
    return f"invalid setting {ENV_PREFIX}{str(first['loc'][0]).upper()}: {message}"


def declared(name: str, what: str) -> str | None:
    """What `setting` declared of a field besides its default and description: `chart`,
    `not_in_chart` or `shown`."""
    extra = Settings.model_fields[name].json_schema_extra
    value = extra.get(what) if isinstance(extra, dict) else None
    return None if value is None else str(value)


def shown_default(name: str) -> str:
    """How a setting's default reads in the docs."""
    shown = declared(name, "shown")
    if shown is not None:
        return shown
    default = Settings.model_fields[name].default
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, tuple):
        return f"`{','.join(default)}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def settings_table() -> str:
    """The README's table of settings, made from `Settings` alone."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        rows.append(
            f"| `{ENV_PREFIX}{name.upper()}` | {shown_default(name)} | {field.description} |"
        )
    return "\n".join(rows) + "\n"


README = Path(__file__).resolve().parent.parent / "README.md"
TABLE_START, TABLE_END = (
    "<!-- settings table: make settings-table -->",
    "<!-- end of settings table -->",
)


def readme_with_table(readme: str) -> str:
    """The README with its settings table made anew from `Settings`."""
    head, start, rest = readme.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"the README has no {TABLE_START} ... {TABLE_END} block")
    return f"{head}{start}\n{settings_table()}{end}{tail}"


if __name__ == "__main__":  # make settings-table
    README.write_text(readme_with_table(README.read_text()))
