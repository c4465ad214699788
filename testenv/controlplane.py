"""etcd and kube-apiserver as the project runs them: the suite's control plane on loopback
(tests/controlplane.py, envtest's way) and the e2e cluster's (testenv/cluster.py) start the
same two command lines, with what differs between them said in the arguments, and start and
wait for their processes the same way (`start`, `wait_ready`): the cluster wraps each command
to run it in its network namespace, and probes from inside it. The suite stops its two with
`stop`; the cluster stops every process of its namespace at once, these two among them.

Standard library only: cluster.py runs it as a script's sibling, the suite imports it as
`testenv.controlplane`.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

POLL_SECONDS = 0.2
LOG_TAIL_CHARS = 4000


class NotReady(RuntimeError):
    """A process did not become ready: it exited, or its time ran out. The message has the tail
    of its log."""


def start(
    command: Sequence[str], log: Path, *, own_session: bool = False
) -> subprocess.Popen[bytes]:
    """The process, its output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        return subprocess.Popen(
            list(command),
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=own_session,
        )


def wait_ready(
    what: str,
    ready: Callable[[], bool],
    log: Path,
    seconds: float,
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Until `ready()` holds; NotReady, with the log's tail, if `process` exits first or the
    time runs out."""
    deadline = time.monotonic() + seconds
    while not ready():
        if process is not None and process.poll() is not None:
            raise NotReady(f"{what} exited; {log.name} ends:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise NotReady(f"{what} not ready in {seconds:g} s; {log.name} ends:\n{_tail(log)}")
        time.sleep(POLL_SECONDS)


def stop(process: subprocess.Popen[bytes], grace_seconds: float = 20) -> None:
    """SIGTERM, then SIGKILL after the grace; waited for either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return "(no log)"


def etcd_command(
    etcd: str, data_dir: Path, client_port: int, peer_port: int, *, fsync: bool = True
) -> list[str]:
    """One etcd member on loopback. `fsync=False` for a throwaway store (the suite's): a test
    loses nothing when the machine does."""
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    command = [
        etcd,
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--quota-backend-bytes=2147483648",
    ]
    if not fsync:
        command.append("--unsafe-no-fsync")
    return command


@dataclass(frozen=True)
class ApiServer:
    """What a kube-apiserver is given: where it listens, its serving pair, who may call it (a
    static token file; RBAC), the service-account keys, and anything one caller adds."""

    binary: str
    etcd_client_port: int
    bind_address: str
    advertise_address: str
    secure_port: int
    service_cidr: str
    tls_cert: Path
    tls_key: Path
    token_file: Path
    service_account_key: Path
    issuer: str = "https://kubernetes.default.svc"
    authorization_mode: str = "RBAC"
    extra: Sequence[str] = field(default_factory=tuple)

    def command(self) -> list[str]:
        return [
            self.binary,
            f"--etcd-servers=http://127.0.0.1:{self.etcd_client_port}",
            f"--bind-address={self.bind_address}",
            f"--advertise-address={self.advertise_address}",
            f"--secure-port={self.secure_port}",
            f"--service-cluster-ip-range={self.service_cidr}",
            f"--tls-cert-file={self.tls_cert}",
            f"--tls-private-key-file={self.tls_key}",
            f"--token-auth-file={self.token_file}",
            f"--authorization-mode={self.authorization_mode}",
            "--allow-privileged=true",
            f"--service-account-key-file={self.service_account_key}",
            f"--service-account-signing-key-file={self.service_account_key}",
            f"--service-account-issuer={self.issuer}",
            *self.extra,
        ]
