"""The end of a certificate, read from its PEM (`hooks.wire.certificates`), for the expiry gauge
of each TLS port: the same instant cryptography reads, on either encoding of the time, and a
clear refusal of anything that is not a certificate."""

from __future__ import annotations

import base64
import contextlib
from datetime import UTC, datetime

import pytest
import trustme
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.wire.certificates import NotACertificate, not_after

CA = trustme.CA()


@settings(max_examples=25, deadline=None)
@given(
    st.datetimes(
        min_value=datetime(1951, 1, 1),
        max_value=datetime(9998, 12, 31),
    )
)
def test_the_end_of_a_certificate_is_the_instant_cryptography_reads(moment: datetime) -> None:
    """Before 2050 the end is a UTCTime (two-digit years, 1950 to 2049), from 2050 on a
    GeneralizedTime."""
    ends = moment.replace(microsecond=0, tzinfo=UTC)
    pem = CA.issue_cert("a.test", not_before=datetime(1950, 1, 1, tzinfo=UTC), not_after=ends)
    pem_bytes = pem.cert_chain_pems[0].bytes()
    read = x509.load_pem_x509_certificate(pem_bytes).not_valid_after_utc
    assert not_after(pem_bytes) == read.timestamp() == ends.timestamp()


def test_the_first_certificate_of_a_chain_is_the_one_read() -> None:
    leaf = CA.issue_cert("a.test", not_after=datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC))
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems) + CA.cert_pem.bytes()
    assert not_after(chain) == datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC).timestamp()


@given(st.binary(max_size=512))
def test_anything_else_is_refused_as_not_a_certificate(garbage: bytes) -> None:
    """Bytes, bare or in a PEM block, give an end or NotACertificate, never another error: a
    file the kubelet half wrote must not stop the listener."""
    block = base64.b64encode(garbage)
    pem = b"-----BEGIN CERTIFICATE-----\n" + block + b"\n-----END CERTIFICATE-----"
    for candidate in (garbage, pem):
        with contextlib.suppress(NotACertificate):
            assert isinstance(not_after(candidate), float)


@pytest.mark.parametrize(
    "pem",
    [b"", b"no pem here", CA.private_key_pem.bytes()],
)
def test_a_file_without_a_certificate_is_refused(pem: bytes) -> None:
    with pytest.raises(NotACertificate):
        not_after(pem)
