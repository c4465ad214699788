"""Files laid out as the kubelet mounts a Secret or ConfigMap volume, and updated as it updates
them: each generation of the files in a directory of its own, `..data` a link to the current one,
each file a link through `..data` (`token -> ..data/token`). An update writes a new generation,
points `..data` at it in one rename and removes the old one: the file's own link never changes,
only what it resolves to."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import trustme


class MountedVolume:
    def __init__(self, root: Path, files: Mapping[str, bytes]) -> None:
        self.root = root
        self._numbers = itertools.count()
        root.mkdir(parents=True, exist_ok=True)
        self.swap(self.write_generation(files))
        for name in files:
            (root / name).symlink_to(f"..data/{name}")

    def path(self, name: str) -> Path:
        return self.root / name

    def write_generation(self, files: Mapping[str, bytes]) -> Path:
        """A new generation's directory, not yet the current one."""
        generation = self.root / f"..2026_12_03_00_00_00.{next(self._numbers)}"
        generation.mkdir()
        for name, content in files.items():
            (generation / name).write_bytes(content)
        return generation

    def swap(self, generation: Path) -> None:
        """`..data` points at `generation` in one rename."""
        link = self.root / "..data_tmp"
        link.symlink_to(generation.name)
        os.replace(link, self.root / "..data")

    def update(self, files: Mapping[str, bytes]) -> None:
        """The kubelet's update: the new generation swapped in, the old one removed."""
        current = (self.root / "..data").resolve()
        self.swap(self.write_generation(files))
        shutil.rmtree(current)


def tls_files(leaf: trustme.LeafCert) -> dict[str, bytes]:
    """A kubernetes.io/tls Secret's files for this certificate."""
    return {"tls.crt": leaf.cert_chain_pems[0].bytes(), "tls.key": leaf.private_key_pem.bytes()}
