"""A real two-node Kubernetes cluster inside a network namespace of its own, for `make e2e`.

    python testenv/cluster.py run --dir DIR --tools TOOLS -- COMMAND...   # up, COMMAND, down
    python testenv/cluster.py down --dir DIR                              # after a kill -9
    python testenv/cluster.py stop-kubelet|start-kubelet --dir DIR --tools TOOLS --node NAME

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy run as processes in
one network namespace that has only a loopback interface and no route out, and so does each
node's containerd (Debian's, with runc and the bridge CNI plugin) and kubelet: the nodes'
addresses sit on that `lo`, each node's pods are on a bridge of its own inside it, and nothing
listens on or reaches the host's interfaces. The first node runs every pod (CoreDNS among them);
the second is a GPU node whose devices a fake device plugin advertises to its kubelet. Each node's
daemons share one persistent private mount namespace of the node's own, so that its containerd
sees the volumes its kubelet mounts and none of those mounts reach the host. COMMAND runs in the
network namespace with KUBECONFIG and GPUCLASS_E2E_DIR set; whatever it does, `run` then stops
every process in the namespace, removes the namespace, the mounts and the cgroups, and leaves
DIR's logs (DIR/logs) for a failed run to be read. `stop-kubelet` and `start-kubelet` stop a
node's kubelet (its containers run on) and start it again, for a test of a node gone NotReady.

Needs root, Linux with cgroup v1 or v2, and Debian's containerd, runc, containernetworking-plugins
and iptables. TOOLS holds the binaries and images `testenv/build.sh cluster` builds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trustme
from controlplane import (  # testenv/controlplane.py
    ApiServer,
    NotReady,
    etcd_command,
    wait_ready,
)
from controlplane import start as start_process

CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
# The whole control plane agrees on it, as a cluster turning the gate on would.
DEVICE_TAINT_RULES_GATE = "DRADeviceTaintRules=true"
API_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
ADMIN_TOKEN = "e2e-admin-token"
PAUSE_IMAGE = "e2e.local/pause:1"
COREDNS_IMAGE = "e2e.local/coredns:1"
# On the node before anything runs, as a registry would serve them: e2e.local/<name>:1.
NODE_IMAGES = (
    "pause",
    "coredns",
    "metacontroller",
    "cert-manager-controller",
    "cert-manager-cainjector",
)
BOOT_SECONDS = 120
STOP_SECONDS = 20
CGROUP_ROOT = "gpuclass-e2e"
CNI_BIN = "/usr/lib/cni"
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380


@dataclass(frozen=True)
class Node:
    """One node: a kubelet and a containerd of its own, in a mount namespace of its own (the
    kubelet's device-plugin socket has a fixed path, /var/lib/kubelet/device-plugins, and its pod
    log directory is swept of pods it does not run)."""

    name: str
    ip: str
    pod_cidr: str
    bridge: str
    healthz_port: int
    images: tuple[str, ...]  # imported into its containerd, as a registry would serve them
    taints: tuple[dict[str, str], ...] = ()
    labels: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()  # what its fake device plugin advertises: DOMAIN/NAME=COUNT

    def log(self, daemon: str) -> str:
        return daemon if self is CONTROL_NODE else f"{daemon}-{self.name}"


# Every pod of the install runs on the first node. The second is a GPU worker as Cozystack's are:
# tainted so that nothing lands there by chance, its devices advertised by a device plugin
# registered with its kubelet (testenv/kubernetes/deviceplugin), none of them permitted by
# KubeVirt but the first.
CONTROL_NODE = Node("node-1", "10.233.0.1", "10.244.0.0/24", "cni0", 10248, images=NODE_IMAGES)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_NODE = Node(
    "gpu-1",
    "10.233.0.2",
    "10.244.1.0/24",
    "cni1",
    10258,
    images=("pause",),
    taints=(GPU_TAINT,),
    labels=("nvidia.com/gpu.present=true",),
    devices=("nvidia.com/L40S=4", "nvidia.com/NVIDIA_L40S-24Q=2"),
)
NODES = (CONTROL_NODE, GPU_NODE)
NODE_IP = CONTROL_NODE.ip


@dataclass(frozen=True)
class Cluster:
    directory: Path
    tools: Path

    @property
    def name(self) -> str:
        """The network namespace's name: one per directory, so two runs never share one."""
        digest = hashlib.sha256(str(self.directory.resolve()).encode()).hexdigest()
        return "gpuclass-e2e-" + digest[:8]

    @property
    def netns(self) -> Path:
        return Path("/run/netns") / self.name

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    def path(self, *parts: str) -> Path:
        return self.directory.joinpath(*parts)

    def home(self, node: Node) -> Path:
        """What is the node's own: the first node's is the cluster's directory, as it always
        was (the tests reach its containerd there)."""
        return self.directory if node is CONTROL_NODE else self.directory / node.name

    def mountns(self, node: Node) -> Path:
        return self.home(node) / "mountns"

    def containerd_socket(self, node: Node) -> Path:
        return self.home(node) / "containerd" / "containerd.sock"

    def tool(self, name: str) -> str:
        path = self.tools / name
        if not path.exists():
            raise SystemExit(f"{path} is missing: `testenv/build.sh cluster` builds it")
        return str(path)

    def inside(self, *command: str, mount: bool = True, node: Node = CONTROL_NODE) -> list[str]:
        """COMMAND in the cluster's network namespace (and the node's mount namespace)."""
        entered = [f"--net={self.netns}"] + ([f"--mount={self.mountns(node)}"] if mount else [])
        return ["nsenter", *entered, "--", *command]


def sh(
    *command: str, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=check, text=True, capture_output=True, input=input)


# --- the namespaces -------------------------------------------------------------------------


def make_namespaces(cluster: Cluster) -> None:
    sh("ip", "netns", "add", cluster.name)
    for command in (
        ["ip", "link", "set", "lo", "up"],
        *(["ip", "addr", "add", f"{node.ip}/32", "dev", "lo"] for node in NODES),
        # kube-apiserver dials a webhook's ClusterIP before kube-proxy's DNAT applies: without a
        # route for the Service range the dial fails at once (there is no default route).
        ["ip", "route", "add", SERVICE_CIDR, "dev", "lo", "src", NODE_IP],
        ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
        ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"],
    ):
        sh(*cluster.inside(*command, mount=False))
    # `unshare --mount=FILE` keeps a mount namespace alive in FILE, which must sit on a private
    # mount. /run/netns (the pods' network namespaces), /var/log (the kubelet's pod logs) and
    # /var/lib/kubelet (its device-plugin socket), at fixed paths, are each node's own inside it.
    sh("mount", "--bind", str(cluster.directory), str(cluster.directory))
    sh("mount", "--make-private", str(cluster.directory))
    # A bind needs its mount point: a machine that never ran a kubelet has no /var/lib/kubelet.
    # The empty directory is left on the host; nothing is ever written to it there.
    for _, target in MOUNTED:
        Path(target).mkdir(parents=True, exist_ok=True)
    for node in NODES:
        home = cluster.home(node)
        home.mkdir(exist_ok=True)
        cluster.mountns(node).touch()
        sh("unshare", f"--mount={cluster.mountns(node)}", "--propagation", "private", "true")
        for source, target in MOUNTED:
            (home / source).mkdir()
            sh(*cluster.inside("mount", "--bind", str(home / source), target, node=node))


MOUNTED = (
    ("run-netns", "/run/netns"),
    ("var-log", "/var/log"),
    ("var-lib-kubelet", "/var/lib/kubelet"),
)


def remove_namespaces(cluster: Cluster) -> None:
    stop_processes(cluster)
    if cluster.netns.exists():
        sh("ip", "netns", "del", cluster.name, check=False)
    for node in reversed(NODES):  # the second node's file sits inside the first's directory
        if cluster.mountns(node).exists():
            sh("umount", str(cluster.mountns(node)), check=False)
    # The namespace's last processes may still hold the mount for a moment after they are killed.
    deadline = time.monotonic() + STOP_SECONDS
    while sh("mountpoint", "-q", str(cluster.directory), check=False).returncode == 0:
        if sh("umount", str(cluster.directory), check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"{cluster.directory} stays mounted: umount it by hand")
            time.sleep(0.5)
    remove_cgroups()


def cluster_pids(cluster: Cluster) -> set[int]:
    """The daemons (in the cluster's network namespace) and every container (in the kubelet's
    cgroups; a pod's processes are in a network namespace of the pod's own)."""
    listed = sh("ip", "netns", "pids", cluster.name, check=False).stdout.split()
    pids = {int(pid) for pid in listed}
    for hierarchy in cgroup_hierarchies():
        for cgroup in cgroups_under(hierarchy / CGROUP_ROOT):
            with contextlib.suppress(OSError):
                pids.update(int(pid) for pid in (cgroup / "cgroup.procs").read_text().split())
    return pids - {os.getpid()}


def stop_processes(cluster: Cluster) -> None:
    """SIGTERM to every process of the cluster (daemons, shims, containers), SIGKILL to what is
    left after STOP_SECONDS."""
    for sig, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, 10)):
        for pid in cluster_pids(cluster):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while cluster_pids(cluster) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not cluster_pids(cluster):
            return


def write_memory(cluster: Cluster) -> None:
    """`logs/memory.txt`: the resident memory of every process of the cluster at the end of the
    run, and the most each ever held (VmHWM), by command, largest first."""
    by_command: dict[str, list[int]] = {}
    for pid in cluster_pids(cluster):
        with contextlib.suppress(OSError):
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            fields = dict(
                line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            )
            kib = [int(fields.get(key, "0 kB").split()[0]) for key in ("VmRSS", "VmHWM")]
            totals = by_command.setdefault(name, [0, 0])
            totals[0], totals[1] = totals[0] + kib[0], totals[1] + kib[1]
    rows = sorted(by_command.items(), key=lambda row: -row[1][0])
    lines = [f"{'command':<24}{'rss MiB':>10}{'peak MiB':>10}"]
    lines += [f"{name:<24}{rss / 1024:>10.0f}{peak / 1024:>10.0f}" for name, (rss, peak) in rows]
    rss, peak = (sum(row[1][i] for row in rows) for i in (0, 1))
    lines.append(f"{'all':<24}{rss / 1024:>10.0f}{peak / 1024:>10.0f}")
    cluster.path("logs", "memory.txt").write_text("\n".join(lines) + "\n")


def cgroup_hierarchies() -> list[Path]:
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return [root]
    return [path for path in root.iterdir() if path.is_dir() and not path.is_symlink()]


def cgroups_under(top: Path) -> list[Path]:
    """Every cgroup below top and top itself, deepest first. Containers end while this walks
    (the cgroups of a stopping cluster vanish under it): a folder gone is skipped, not an
    error."""
    found = [Path(folder) for folder, _, _ in os.walk(top)]  # os.walk skips what vanishes
    return sorted(found, key=lambda path: -len(path.parts))


def make_cgroups() -> None:
    for hierarchy in cgroup_hierarchies():
        for node in NODES:
            (hierarchy / node_cgroup(node).lstrip("/")).mkdir(parents=True, exist_ok=True)


def remove_cgroups() -> None:
    """Depth first: a cgroup goes only once its children have."""
    for hierarchy in cgroup_hierarchies():
        for folder in cgroups_under(hierarchy / CGROUP_ROOT):
            rmdir_when_empty(folder)


def rmdir_when_empty(cgroup: Path) -> None:
    """A cgroup whose last process was just killed stays busy until the kernel has reaped it."""
    deadline = time.monotonic() + STOP_SECONDS
    while True:
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return  # the kernel took it with its last process
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# --- certificates and configuration ---------------------------------------------------------


def node_token(node: Node) -> str:
    return f"e2e-node-token-{node.name}"


def write_pki(cluster: Cluster) -> None:
    pki = cluster.path("pki")
    pki.mkdir()
    ca = trustme.CA(organization_name="gpuclass-e2e")
    serving = ca.issue_cert(
        *(node.ip for node in NODES),
        API_SERVICE_IP,
        "127.0.0.1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    )
    kubelet_client = ca.issue_cert("kube-apiserver-kubelet-client", common_name="kube-apiserver")
    signing = ca.issue_cert("service-accounts")
    ca.cert_pem.write_to_path(str(pki / "ca.crt"))
    ca.private_key_pem.write_to_path(str(pki / "ca.key"))
    for name, issued in (("apiserver", serving), ("kubelet-client", kubelet_client)):
        issued.cert_chain_pems[0].write_to_path(str(pki / f"{name}.crt"))
        issued.private_key_pem.write_to_path(str(pki / f"{name}.key"))
    signing.private_key_pem.write_to_path(str(pki / "sa.key"))
    # Each kubelet as itself: the Node authorizer lets it write only its own node.
    (pki / "tokens.csv").write_text(
        f'{ADMIN_TOKEN},admin,admin,"system:masters"\n'
        + "".join(
            f'{node_token(node)},system:node:{node.name},{node.name},"system:nodes"\n'
            for node in NODES
        )
    )
    configs = [(cluster.kubeconfig, ADMIN_TOKEN)]
    configs += [(cluster.home(node) / "kubelet.kubeconfig", node_token(node)) for node in NODES]
    for path, token in configs:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "e2e",
                            "cluster": {
                                "server": f"https://{NODE_IP}:6443",
                                "certificate-authority": str(pki / "ca.crt"),
                            },
                        }
                    ],
                    "users": [{"name": "e2e", "user": {"token": token}}],
                    "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
                    "current-context": "e2e",
                }
            )
        )


def write_runtime_config(cluster: Cluster, node: Node) -> None:
    home = cluster.home(node)
    containerd = home / "containerd"
    cni = home / "cni"
    for folder in (containerd, cni):
        folder.mkdir()
    # Root here may lack CAP_SYS_RESOURCE: runc cannot then lower a container's oom_score_adj,
    # and without restrict_oom_score_adj every sandbox fails to start.
    (containerd / "config.toml").write_text(
        f"""version = 2
root = "{containerd}/root"
state = "{containerd}/state"
[grpc]
  address = "{cluster.containerd_socket(node)}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = false
"""
    )
    (cni / "10-bridge.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "e2e",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": node.bridge,
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(home / "cni-ipam"),
                            "ranges": [[{"subnet": node.pod_cidr}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            }
        )
    )
    (home / "kubelet.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                # containerd 1.6 does not report its cgroup driver: the kubelet takes this one.
                "cgroupDriver": "cgroupfs",
                "cgroupRoot": node_cgroup(node),
                "failCgroupV1": False,
                "failSwapOn": False,
                "clusterDNS": [DNS_SERVICE_IP],
                "clusterDomain": "cluster.local",
                "resolvConf": "",
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": False},
                    "x509": {"clientCAFile": str(cluster.path("pki", "ca.crt"))},
                },
                "authorization": {"mode": "AlwaysAllow"},
                "readOnlyPort": 0,
                "healthzBindAddress": "127.0.0.1",
                "healthzPort": node.healthz_port,
                # Each kubelet on its own address: both serve port 10250.
                "address": node.ip,
                "registerWithTaints": list(node.taints),
                # Nothing can be pulled back: images are imported, so never collect them, and
                # evict only when the disk is really full.
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "evictionHard": {
                    "memory.available": "100Mi",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                    "nodefs.inodesFree": "1%",
                },
                "podLogsDir": "/var/log/pods",
                "serializeImagePulls": False,
                "containerRuntimeEndpoint": f"unix://{cluster.containerd_socket(node)}",
            }
        )
    )


def node_cgroup(node: Node) -> str:
    return f"/{CGROUP_ROOT}" if node is CONTROL_NODE else f"/{CGROUP_ROOT}/{node.name}"


def write_proxy_config(cluster: Cluster) -> None:
    (cluster.path("kube-proxy.yaml")).write_text(
        json.dumps(
            {
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                "kind": "KubeProxyConfiguration",
                "mode": "iptables",
                "clientConnection": {"kubeconfig": str(cluster.kubeconfig)},
                "hostnameOverride": CONTROL_NODE.name,
                "clusterCIDR": CLUSTER_CIDR,
                "bindAddress": NODE_IP,
                "healthzBindAddress": "127.0.0.1:10256",
                "metricsBindAddress": "127.0.0.1:10249",
                # The namespace's conntrack table is the host's: leave its size alone.
                "conntrack": {"maxPerCore": 0},
            }
        )
    )


# --- the daemons ----------------------------------------------------------------------------


def wait_until(what: str, ready: Callable[[], bool], cluster: Cluster, log: str) -> None:
    try:
        wait_ready(what, ready, cluster.path("logs", f"{log}.log"), BOOT_SECONDS)
    except NotReady as error:
        raise SystemExit(str(error)) from None


def healthy(cluster: Cluster, url: str) -> bool:
    """An HTTP(S) GET inside the namespace answered 200 (curl would need to be installed)."""
    script = (
        "import ssl,sys,urllib.request;"
        "c=ssl.create_default_context(cafile=sys.argv[2]);"
        "h={'Authorization':'Bearer '+sys.argv[3]};"
        "sys.exit(0 if urllib.request.urlopen(urllib.request.Request(sys.argv[1],headers=h),"
        "context=c,timeout=3).status==200 else 1)"
    )
    probe = subprocess.run(
        cluster.inside(
            sys.executable,
            "-c",
            script,
            url,
            str(cluster.path("pki", "ca.crt")),
            ADMIN_TOKEN,
            mount=False,
        ),
        capture_output=True,
        timeout=20,
    )
    return probe.returncode == 0


def kubectl(cluster: Cluster, *arguments: str, input: str | None = None, check: bool = True) -> str:
    return sh(
        *cluster.inside(
            cluster.tool("kubectl"), f"--kubeconfig={cluster.kubeconfig}", *arguments, mount=False
        ),
        input=input,
        check=check,
    ).stdout


def start_control_plane(cluster: Cluster) -> None:
    pki = cluster.path("pki")
    start(
        cluster,
        "etcd",
        *etcd_command(cluster.tool("etcd"), cluster.path("etcd"), ETCD_CLIENT_PORT, ETCD_PEER_PORT),
    )
    api_server = ApiServer(
        cluster.tool("kube-apiserver"),
        etcd_client_port=ETCD_CLIENT_PORT,
        bind_address="0.0.0.0",
        advertise_address=NODE_IP,
        secure_port=6443,
        service_cidr=SERVICE_CIDR,
        tls_cert=pki / "apiserver.crt",
        tls_key=pki / "apiserver.key",
        token_file=pki / "tokens.csv",
        service_account_key=pki / "sa.key",
        issuer="https://kubernetes.default.svc.cluster.local",
        authorization_mode="Node,RBAC",
        extra=(
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
            # DeviceTaintRules, beta and off by default: DRA classes read them where served.
            "--runtime-config=resource.k8s.io/v1beta2=true",
            f"--feature-gates={DEVICE_TAINT_RULES_GATE}",
        ),
    )
    start(cluster, "kube-apiserver", *api_server.command())
    wait_until(
        "kube-apiserver",
        lambda: healthy(cluster, f"https://{NODE_IP}:6443/readyz"),
        cluster,
        "kube-apiserver",
    )
    start(
        cluster,
        "kube-controller-manager",
        cluster.tool("kube-controller-manager"),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        "--use-service-account-credentials=true",
        f"--cluster-cidr={CLUSTER_CIDR}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--controllers=*,-nodeipam",
        f"--feature-gates={DEVICE_TAINT_RULES_GATE}",
    )
    start(
        cluster,
        "kube-scheduler",
        cluster.tool("kube-scheduler"),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        f"--feature-gates={DEVICE_TAINT_RULES_GATE}",
    )


def start(
    cluster: Cluster, name: str, *command: str, node: Node = CONTROL_NODE
) -> subprocess.Popen[bytes]:
    log = cluster.path("logs", f"{name}.log")
    return start_process(cluster.inside(*command, node=node), log, own_session=True)


def start_node(cluster: Cluster, node: Node) -> None:
    home = cluster.home(node)
    start(
        cluster,
        node.log("containerd"),
        "containerd",
        f"--config={home / 'containerd' / 'config.toml'}",
        node=node,
    )
    ctr = ["ctr", f"--address={cluster.containerd_socket(node)}", "--namespace=k8s.io"]
    wait_until(
        f"{node.name}'s containerd",
        lambda: sh(*cluster.inside(*ctr, "version", node=node), check=False).returncode == 0,
        cluster,
        node.log("containerd"),
    )
    for image in node.images:
        sh(*cluster.inside(*ctr, "images", "import", cluster.tool(f"{image}.tar"), node=node))
    start_kubelet(cluster, node)
    if node.devices:
        start(
            cluster,
            node.log("device-plugin"),
            cluster.tool("fake-device-plugin"),
            *node.devices,
            node=node,
        )


def kubelet_command(cluster: Cluster, node: Node) -> list[str]:
    home = cluster.home(node)
    return [
        cluster.tool("kubelet"),
        f"--config={home / 'kubelet.yaml'}",
        f"--kubeconfig={home / 'kubelet.kubeconfig'}",
        f"--root-dir={home / 'kubelet'}",
        f"--node-ip={node.ip}",
        f"--hostname-override={node.name}",
        *([f"--node-labels={','.join(node.labels)}"] if node.labels else []),
    ]


def start_kubelet(cluster: Cluster, node: Node) -> None:
    start(cluster, node.log("kubelet"), *kubelet_command(cluster, node), node=node)


def stop_kubelet(cluster: Cluster, node: Node) -> None:
    """The node's kubelet stops (SIGTERM); its containers and its device plugin run on."""
    command = kubelet_command(cluster, node)
    for pid in cluster_pids(cluster):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1] == [
                part.encode() for part in command
            ]:
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + STOP_SECONDS
                while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
                return
    raise SystemExit(f"no kubelet of {node.name} is running")


def start_nodes(cluster: Cluster) -> None:
    make_cgroups()
    for node in NODES:
        start_node(cluster, node)
    start(
        cluster,
        "kube-proxy",
        cluster.tool("kube-proxy"),
        f"--config={cluster.path('kube-proxy.yaml')}",
    )
    for node in NODES:
        wait_until(
            f"the node {node.name}",
            functools.partial(node_registered_ready, cluster, node),
            cluster,
            node.log("kubelet"),
        )
        # Each node holds its own pod range (kube-controller-manager's IPAM is off).
        kubectl(
            cluster,
            "patch",
            "node",
            node.name,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]}}),
        )


def node_registered_ready(cluster: Cluster, node: Node) -> bool:
    return node_ready(kubectl(cluster, "get", "node", node.name, "-o", "json", check=False))


def node_ready(listed: str) -> bool:
    if not listed:
        return False
    conditions = json.loads(listed).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


COREFILE = """.:53 {
    errors
    health :8080
    ready :8181
    cache 30
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        ttl 30
    }
}
"""


def start_dns(cluster: Cluster) -> None:
    """CoreDNS as kubeadm installs it: a Deployment behind the kube-dns Service."""
    labels = {"k8s-app": "kube-dns"}
    documents = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": COREFILE},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "containers": [
                            {
                                "name": "coredns",
                                "image": COREDNS_IMAGE,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile", "-dns.port", "53"],
                                "ports": [
                                    {"containerPort": 53, "protocol": "UDP", "name": "dns"},
                                    {"containerPort": 53, "protocol": "TCP", "name": "dns-tcp"},
                                ],
                                "securityContext": {
                                    "capabilities": {"add": ["NET_BIND_SERVICE"]},
                                    "runAsUser": 0,
                                },
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}},
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "selector": labels,
                "clusterIP": DNS_SERVICE_IP,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                ],
            },
        },
    ]
    kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
    )
    kubectl(
        cluster,
        "-n",
        "kube-system",
        "rollout",
        "status",
        "deployment/coredns",
        f"--timeout={BOOT_SECONDS}s",
    )


# --- the commands ---------------------------------------------------------------------------


def up(cluster: Cluster) -> None:
    started = time.monotonic()
    down(cluster)
    shutil.rmtree(cluster.directory, ignore_errors=True)
    cluster.directory.mkdir(parents=True)
    make_namespaces(cluster)
    write_pki(cluster)
    for node in NODES:
        write_runtime_config(cluster, node)
    write_proxy_config(cluster)
    start_control_plane(cluster)
    start_nodes(cluster)
    start_dns(cluster)
    print(f"cluster up in {time.monotonic() - started:.1f} s ({cluster.directory})", flush=True)


def down(cluster: Cluster) -> None:
    """Everything `up` made goes, whatever state a run left it in; DIR's logs stay."""
    if not cluster.directory.exists():
        return
    remove_namespaces(cluster)
    shutil.rmtree(cluster.path("etcd"), ignore_errors=True)
    for node in NODES:
        for leftover in ("containerd", "kubelet", "run-netns", "var-lib-kubelet", "cni-ipam"):
            shutil.rmtree(cluster.home(node) / leftover, ignore_errors=True)


def run(cluster: Cluster, command: list[str]) -> int:
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        up(cluster)
        environment = dict(
            os.environ, KUBECONFIG=str(cluster.kubeconfig), GPUCLASS_E2E_DIR=str(cluster.directory)
        )
        return subprocess.run(cluster.inside(*command, mount=False), env=environment).returncode
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            write_memory(cluster)
        down(cluster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("run", "up", "down", "stop-kubelet", "start-kubelet"))
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--tools", type=Path, default=Path("."))
    parser.add_argument("--node", choices=[node.name for node in NODES], default=GPU_NODE.name)
    arguments = sys.argv[1:]
    split = arguments.index("--") if "--" in arguments else len(arguments)
    options = parser.parse_args(arguments[:split])
    options.command = arguments[split + 1 :]
    cluster = Cluster(options.dir.resolve(), options.tools.resolve())
    node = next(node for node in NODES if node.name == options.node)
    if options.action == "run":
        sys.exit(run(cluster, options.command))
    elif options.action == "up":
        up(cluster)
    elif options.action == "down":
        down(cluster)
    elif options.action == "stop-kubelet":
        stop_kubelet(cluster, node)
    else:
        start_kubelet(cluster, node)


if __name__ == "__main__":
    main()
