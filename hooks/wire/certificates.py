"""The one field of an X.509 certificate the service reads: when it ends (`notAfter`), for the
expiry gauge of each TLS listener. A walk over the DER encoding down to the validity, nothing
else: the standard library verifies and serves certificates but does not read one it serves."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime

PEM_BEGIN, PEM_END = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
SEQUENCE, EXPLICIT_VERSION, UTC_TIME, GENERALIZED_TIME = 0x30, 0xA0, 0x17, 0x18


class NotACertificate(ValueError):
    pass


def not_after(pem: bytes) -> float:
    """When the first certificate of a PEM file ends, as Unix time."""
    start = pem.find(PEM_BEGIN)
    end = pem.find(PEM_END, start)
    if start < 0 or end < 0:
        raise NotACertificate("no PEM certificate")
    try:
        der = base64.b64decode(pem[start + len(PEM_BEGIN) : end], validate=False)
    except binascii.Error as error:
        raise NotACertificate("the PEM block is not base64") from error
    _, certificate, _ = _element(der, 0, SEQUENCE)
    _, tbs, _ = _element(der, certificate, SEQUENCE)
    offset = tbs
    if der[offset : offset + 1] == bytes([EXPLICIT_VERSION]):
        offset = _element(der, offset)[2]
    for _ in ("serialNumber", "signature", "issuer"):
        offset = _element(der, offset)[2]
    _, validity, _ = _element(der, offset, SEQUENCE)
    not_before_end = _element(der, validity)[2]
    tag, value, value_end = _element(der, not_before_end)
    return _time(tag, der[value:value_end])


def _element(der: bytes, offset: int, expected: int | None = None) -> tuple[int, int, int]:
    """The tag at offset, where its value starts, and where it ends."""
    if offset + 2 > len(der):
        raise NotACertificate("truncated")
    tag, length = der[offset], der[offset + 1]
    start = offset + 2
    if length & 0x80:
        size = length & 0x7F
        if size == 0 or size > 4 or start + size > len(der):
            raise NotACertificate("bad length")
        length = int.from_bytes(der[start : start + size], "big")
        start += size
    if expected is not None and tag != expected:
        raise NotACertificate(f"tag {tag:#x} where {expected:#x} belongs")
    if start + length > len(der):
        raise NotACertificate("truncated")
    return tag, start, start + length


def _time(tag: int, value: bytes) -> float:
    if tag not in (UTC_TIME, GENERALIZED_TIME):
        raise NotACertificate(f"tag {tag:#x} is not a time")
    try:
        text = value.decode("ascii")
        if tag == UTC_TIME:  # RFC 5280: two-digit years from 50 are 19xx, below 50 20xx
            text = ("19" if int(text[:2]) >= 50 else "20") + text
        moment = datetime.strptime(text, "%Y%m%d%H%M%SZ")
    except (UnicodeDecodeError, ValueError) as error:
        raise NotACertificate("not a time") from error
    return moment.replace(tzinfo=UTC).timestamp()
