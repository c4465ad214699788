"""Test certificates (trustme): one CA, a server certificate for 127.0.0.1 and a client
certificate for Metacontroller, written as PEM files."""

from __future__ import annotations

from pathlib import Path

import trustme

PKI_FILES = ("ca", "cert", "key", "client.crt", "client.key")


def write_pki(folder: Path) -> dict[str, Path]:
    """The files, by name: `ca`, the server's `cert` and `key`, the client's `client.crt` and
    `client.key`."""
    ca = trustme.CA()
    server, client = ca.issue_cert("127.0.0.1"), ca.issue_cert("metacontroller")
    files = {name: folder / name for name in PKI_FILES}
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client.crt"]))
    client.private_key_pem.write_to_path(str(files["client.key"]))
    return files
