"""The test cluster as the tests drive it: its commands (kubectl, helm, ctr), its objects,
and waiting for what it converges to."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent.parent
CHART = ROOT / "metacontroller"
RELEASE, NAMESPACE = "gpuclass-hooks", "cozy-gpu"
GPU = "nvidia.com/L40S"
# The cluster's GPU node, as testenv/cluster.py makes it: tainted, and advertising through its
# device plugin GPU_DEVICES of GPU (which KubeVirt permits) and VGPU_DEVICES of VGPU (which it
# does not).
GPU_NODE = "gpu-1"
GPU_NODE_TAINT = "nvidia.com/gpu"
GPU_DEVICES = 4
VGPU, VGPU_DEVICES = "nvidia.com/NVIDIA_L40S-24Q", 2


class CommandFailed(AssertionError):
    pass


@dataclass(frozen=True)
class Cluster:
    directory: Path
    tools: Path

    def run(
        self, *command: str, input: str | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise CommandFailed(
                f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}"
                f"\n{done.stderr[-3000:]}"
            )
        return done

    def kubectl(self, *arguments: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.tools / "kubectl"), *arguments, **kwargs)

    def helm(self, *arguments: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.tools / "helm"), *arguments, **kwargs)

    def apply(self, *documents: dict[str, Any]) -> None:
        listed = {"apiVersion": "v1", "kind": "List", "items": list(documents)}
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(listed)
        )

    def get(self, *arguments: str) -> Any:
        done = self.kubectl("get", *arguments, "-o", "json", check=False)
        if done.returncode != 0:
            return None
        return json.loads(done.stdout)

    def secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        found = self.get("secret", "-n", namespace, name)
        if found is None:
            return None
        return {key: base64.b64decode(value) for key, value in found.get("data", {}).items()}

    def ctr(self, *arguments: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        socket = self.directory / "containerd" / "containerd.sock"
        return self.run("ctr", f"--address={socket}", "--namespace=k8s.io", *arguments, **kwargs)

    def rollout(self, kind: str, namespace: str, name: str) -> None:
        self.kubectl("-n", namespace, "rollout", "status", f"{kind}/{name}", "--timeout=180s")

    def logs(self, name: str) -> str:
        return (self.directory / "logs" / f"{name}.log").read_text(errors="replace")


def wait_for(what: str, condition: Callable[[], Any], seconds: float = 120) -> Any:
    """condition's first true value, or a failure naming what never came."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:.0f} s (last: {value!r})")
        time.sleep(1)
