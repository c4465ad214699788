"""Packs one static binary as a single-layer OCI image archive that `ctr images import` takes.

The test cluster has no registry: the pause image, CoreDNS, Metacontroller and cert-manager run
from images made this way (the binary at --path, /<its name> by default, run as user 65532),
imported into the node's containerd and never pulled. The archive is the same for the same binary
(file times are zero).

    python3 testenv/oci_image.py --binary PATH --name e2e.local/pause:1 --output pause.tar
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _layer(binary: Path, path: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        data = binary.read_bytes()
        for depth in range(1, path.count("/")):
            folder = tarfile.TarInfo("/".join(path.strip("/").split("/")[:depth]))
            folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, 0
            layer.addfile(folder)
        entry = tarfile.TarInfo(path.strip("/"))
        entry.size, entry.mode, entry.mtime = len(data), 0o755, 0
        layer.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


def _blob(archive: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    entry = tarfile.TarInfo(f"blobs/sha256/{digest}")
    entry.size, entry.mode, entry.mtime = len(data), 0o644, 0
    archive.addfile(entry, io.BytesIO(data))
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _file(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    entry = tarfile.TarInfo(name)
    entry.size, entry.mode, entry.mtime = len(data), 0o644, 0
    archive.addfile(entry, io.BytesIO(data))


def pack(binary: Path, path: str, reference: str, output: Path, arguments: list[str]) -> None:
    layer = _layer(binary, path)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [path, *arguments], "User": "65532:65532"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    with tarfile.open(output, "w", format=tarfile.PAX_FORMAT) as archive:
        layer_descriptor = _blob(archive, layer, LAYER)
        config_descriptor = _blob(archive, json.dumps(config).encode(), CONFIG)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": config_descriptor,
            "layers": [layer_descriptor],
        }
        manifest_descriptor = _blob(archive, json.dumps(manifest).encode(), MANIFEST)
        manifest_descriptor["annotations"] = {
            "io.containerd.image.name": reference,
            "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
        }
        index = {"schemaVersion": 2, "manifests": [manifest_descriptor]}
        _file(archive, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        _file(archive, "index.json", json.dumps(index).encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", type=Path, required=True)
    parser.add_argument("--path", help="where the binary is in the image (default /<its name>)")
    parser.add_argument("--name", required=True, help="the image reference, with a tag")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("arguments", nargs="*", help="arguments after the entry point")
    options = parser.parse_args()
    path = options.path or f"/{options.binary.name}"
    pack(options.binary, path, options.name, options.output, options.arguments)


if __name__ == "__main__":
    main()
