"""The GPUClass spec: written by people, so validated with pydantic and readable messages.

The CRD validates the same shape at admission; the hook validates again because Metacontroller
may hand it objects written before a CRD upgrade, and a hook must never trust its input.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from hooks.wire.kube import GPUClassStatus, is_absent
from hooks.wire.names import is_dns_label, is_dns_subdomain
from hooks.wire.problems import Undecodable, decoded

DEFAULT_TOKEN_KEY = "client_configuration_token.tok"
GRIDD_KEY = "gridd.conf"

_RESOURCE_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class Toleration(_Spec):
    """A core/v1 Toleration; `tolerationSeconds` is accepted and plays no part."""

    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")

    @model_validator(mode="after")
    def _empty_key_needs_exists(self) -> Toleration:
        if self.key == "" and self.operator not in ("Exists",):
            raise ValueError("a toleration with an empty key requires operator Exists")
        return self


class SecretRef(_Spec):
    name: Annotated[str, Field(min_length=1, max_length=253)]
    namespace: str | None = None
    key: str = DEFAULT_TOKEN_KEY

    @field_validator("namespace")
    @classmethod
    def _namespace_is_dns_label(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_label(value):
            raise ValueError("must be a DNS-1123 label")
        return value

    @field_validator("key")
    @classmethod
    def _key_is_secret_key(cls, value: str) -> str:
        if not value or len(value) > 253 or not _SECRET_KEY.match(value):
            raise ValueError("must be a valid Secret data key")
        if value == GRIDD_KEY:
            raise ValueError(f"{GRIDD_KEY} is generated in every copy and cannot hold the token")
        return value


class License(_Spec):
    secret_ref: SecretRef = Field(alias="secretRef")
    feature_type: Literal[1, 2, 4] = Field(default=1, alias="featureType")


_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
MAX_DRA_ATTRIBUTES = 8
MAX_DRA_STRING = 64  # a DRA string attribute's own bound


class DraSpec(_Spec):
    """A DRA class's devices: its driver's, with these attributes (docs/gpuclass.md)."""

    driver: Annotated[str, Field(min_length=1, max_length=63)]
    # Strict: a boolean is not an integer here, and a class cannot select on one (the CRD's
    # structural schema cannot type a value as a string, an integer or a boolean for CEL).
    attributes: dict[str, StrictInt | StrictStr]

    @field_validator("driver")
    @classmethod
    def _driver_is_dns_subdomain(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError("must be a DNS subdomain")
        return value

    @field_validator("attributes")
    @classmethod
    def _attributes_are_driver_attributes(cls, value: dict[str, int | str]) -> dict[str, int | str]:
        if not 1 <= len(value) <= MAX_DRA_ATTRIBUTES:
            raise ValueError(f"must hold 1 to {MAX_DRA_ATTRIBUTES} attributes")
        for name, wanted in value.items():
            domain, slash, identifier = name.rpartition("/")
            if slash and (len(domain) > 63 or not is_dns_subdomain(domain)):
                raise ValueError("an attribute's domain must be a DNS subdomain")
            if not _C_IDENTIFIER.match(identifier):
                raise ValueError("an attribute's name must be a C identifier of at most 32")
            if isinstance(wanted, str) and len(wanted) > MAX_DRA_STRING:
                raise ValueError(f"a string value holds at most {MAX_DRA_STRING} characters")
        return value


DEVICE_CLASS_SUFFIX = ".gpuclass.cozystack.io"


def device_class_name(class_name: str) -> str:
    """The DeviceClass a DRA class owns: a class's name is a DNS label, so this is a DNS
    subdomain, and no extended resource name (which holds a slash) can equal it."""
    return f"{class_name}{DEVICE_CLASS_SUFFIX}"


class ClassSpec(_Spec):
    """Backed by exactly one of a device plugin's extended resource (`resourceName`) and DRA
    (`dra`); a licensed class is a device-plugin class (docs/gpuclass.md)."""

    resource_name: str | None = Field(default=None, alias="resourceName")
    dra: DraSpec | None = None
    display_name: str | None = Field(default=None, alias="displayName")
    description: str | None = None
    tolerations: tuple[Toleration, ...] = ()
    license: License | None = None

    @field_validator("resource_name")
    @classmethod
    def _is_extended_resource_name(cls, value: str | None) -> str | None:
        return None if value is None else check_resource_name(value)

    @model_validator(mode="after")
    def _one_backing(self) -> ClassSpec:
        if (self.resource_name is None) == (self.dra is None):
            raise ValueError("exactly one of resourceName and dra is required")
        if self.dra is not None and self.license is not None:
            raise ValueError(
                "a DRA class takes no license: no DRA driver publishes vGPU devices yet"
            )
        return self

    def budget_name(self, class_name: str) -> str:
        """What a VM's `gpus[]` entry names to take a unit of the class: the device plugin's
        resource, or the class's DeviceClass."""
        if self.resource_name is not None:
            return self.resource_name
        return device_class_name(class_name)


def check_resource_name(value: str) -> str:
    """The class's resource must be an extended resource name, used literally (never normalised)."""
    domain, slash, name = value.partition("/")
    if not slash or not domain or not name:
        raise ValueError("must look like <domain>/<name>")
    if not is_dns_subdomain(domain):
        raise ValueError("domain must be a DNS subdomain")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ValueError("must not be in the kubernetes.io domain")
    if len(name) > 63 or not _RESOURCE_NAME_PART.match(name):
        raise ValueError("name after the domain must be a qualified name of at most 63 characters")
    if value.startswith("requests."):
        raise ValueError("must not start with requests.")
    return value


class InvalidSpecError(ValueError):
    """The spec cannot be used; the message names the field, never the value."""


def parse_spec(raw: msgspec.Raw) -> ClassSpec:
    """Validate a raw class spec; raise InvalidSpecError with a message naming the field."""
    if is_absent(raw):
        raise InvalidSpecError("spec: missing")
    try:
        return ClassSpec.model_validate_json(bytes(raw))
    except pydantic.ValidationError as error:
        first = error.errors()[0]  # its location and message only: never the value
        location = "spec" + "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]
        )
        message = first["msg"].removeprefix("Value error, ")
        raise InvalidSpecError(f"{location}: {message}") from None


def parse_status(raw: msgspec.Raw) -> GPUClassStatus | None:
    """The class's current status, or None when it is absent or unreadable (treated as empty)."""
    if is_absent(raw):
        return None
    try:
        return decoded(_STATUS, raw)
    except Undecodable:
        return None


_STATUS = msgspec.json.Decoder(GPUClassStatus)
