"""A real one-node Kubernetes cluster inside a network namespace of its own, for `make e2e`.

    python testenv/cluster.py run --dir DIR --tools TOOLS -- COMMAND...   # up, COMMAND, down
    python testenv/cluster.py down --dir DIR                              # after a kill -9

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (Debian's, with runc
and the bridge CNI plugin), the kubelet and kube-proxy run as processes in one network namespace
that has only a loopback interface and no route out: the node's address sits on that `lo`, pods
are on a bridge inside it, and nothing listens on or reaches the host's interfaces. CoreDNS runs
as a pod. Every daemon shares one persistent private mount namespace, so that containerd sees the
volumes the kubelet mounts and none of those mounts reach the host. COMMAND runs in the network
namespace with KUBECONFIG and GPUCLASS_E2E_DIR set; whatever it does, `run` then stops every
process in the namespace, removes the namespace, the mounts and the cgroups, and leaves DIR's
logs (DIR/logs) for a failed run to be read.

Needs root, Linux with cgroup v1 or v2, and Debian's containerd, runc, containernetworking-plugins
and iptables. TOOLS holds the binaries and images `testenv/build.sh cluster` builds.
"""

from __future__ import annotations

import argparse
import contextlib
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
from controlplane import ApiServer, etcd_command  # testenv/controlplane.py

NODE_NAME = "node-1"
NODE_IP = "10.233.0.1"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
API_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
ADMIN_TOKEN = "e2e-admin-token"
NODE_TOKEN = "e2e-node-token"
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
    def mountns(self) -> Path:
        return self.directory / "mountns"

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def containerd_socket(self) -> Path:
        return self.directory / "containerd" / "containerd.sock"

    def path(self, *parts: str) -> Path:
        return self.directory.joinpath(*parts)

    def tool(self, name: str) -> str:
        path = self.tools / name
        if not path.exists():
            raise SystemExit(f"{path} is missing: `testenv/build.sh cluster` builds it")
        return str(path)

    def inside(self, *command: str, mount: bool = True) -> list[str]:
        """COMMAND in the cluster's network namespace (and its mount namespace)."""
        entered = [f"--net={self.netns}"] + ([f"--mount={self.mountns}"] if mount else [])
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
        ["ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo"],
        # kube-apiserver dials a webhook's ClusterIP before kube-proxy's DNAT applies: without a
        # route for the Service range the dial fails at once (there is no default route).
        ["ip", "route", "add", SERVICE_CIDR, "dev", "lo", "src", NODE_IP],
        ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
        ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"],
    ):
        sh(*cluster.inside(*command, mount=False))
    # `unshare --mount=FILE` keeps the mount namespace alive in FILE, which must sit on a private
    # mount. /run/netns (the pods' network namespaces) and /var/log (the kubelet's pod logs, at
    # fixed paths) are the cluster's own inside it.
    sh("mount", "--bind", str(cluster.directory), str(cluster.directory))
    sh("mount", "--make-private", str(cluster.directory))
    cluster.mountns.touch()
    sh("unshare", f"--mount={cluster.mountns}", "--propagation", "private", "true")
    for folder in ("run-netns", "var-log"):
        cluster.path(folder).mkdir()
    for source, target in (("run-netns", "/run/netns"), ("var-log", "/var/log")):
        sh(*cluster.inside("mount", "--bind", str(cluster.path(source)), target))


def remove_namespaces(cluster: Cluster) -> None:
    stop_processes(cluster)
    if cluster.netns.exists():
        sh("ip", "netns", "del", cluster.name, check=False)
    if cluster.mountns.exists():
        sh("umount", str(cluster.mountns), check=False)
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
        (hierarchy / CGROUP_ROOT).mkdir(exist_ok=True)


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


def write_pki(cluster: Cluster) -> None:
    pki = cluster.path("pki")
    pki.mkdir()
    ca = trustme.CA(organization_name="gpuclass-e2e")
    serving = ca.issue_cert(
        NODE_IP,
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
    (pki / "tokens.csv").write_text(
        f'{ADMIN_TOKEN},admin,admin,"system:masters"\n'
        f'{NODE_TOKEN},system:node:{NODE_NAME},node,"system:nodes"\n'
    )
    for name, token in (("kubeconfig", ADMIN_TOKEN), ("kubelet.kubeconfig", NODE_TOKEN)):
        cluster.path(name).write_text(
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


def write_runtime_config(cluster: Cluster) -> None:
    containerd = cluster.path("containerd")
    cni = cluster.path("cni")
    for folder in (containerd, cni):
        folder.mkdir()
    # Root here may lack CAP_SYS_RESOURCE: runc cannot then lower a container's oom_score_adj,
    # and without restrict_oom_score_adj every sandbox fails to start.
    (containerd / "config.toml").write_text(
        f"""version = 2
root = "{containerd}/root"
state = "{containerd}/state"
[grpc]
  address = "{cluster.containerd_socket}"
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
                        "bridge": "cni0",
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(cluster.path("cni-ipam")),
                            "ranges": [[{"subnet": POD_CIDR}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            }
        )
    )
    (cluster.path("kubelet.yaml")).write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                # containerd 1.6 does not report its cgroup driver: the kubelet takes this one.
                "cgroupDriver": "cgroupfs",
                "cgroupRoot": f"/{CGROUP_ROOT}",
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
                "healthzPort": 10248,
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
                "containerRuntimeEndpoint": f"unix://{cluster.containerd_socket}",
            }
        )
    )
    (cluster.path("kube-proxy.yaml")).write_text(
        json.dumps(
            {
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                "kind": "KubeProxyConfiguration",
                "mode": "iptables",
                "clientConnection": {"kubeconfig": str(cluster.kubeconfig)},
                "hostnameOverride": NODE_NAME,
                "clusterCIDR": POD_CIDR,
                "bindAddress": NODE_IP,
                "healthzBindAddress": "127.0.0.1:10256",
                "metricsBindAddress": "127.0.0.1:10249",
                # The namespace's conntrack table is the host's: leave its size alone.
                "conntrack": {"maxPerCore": 0},
            }
        )
    )


# --- the daemons ----------------------------------------------------------------------------


def start(cluster: Cluster, name: str, *command: str) -> subprocess.Popen[bytes]:
    logs = cluster.path("logs")
    logs.mkdir(exist_ok=True)
    with (logs / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            cluster.inside(*command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_until(what: str, ready: Callable[[], bool], cluster: Cluster, log: str) -> None:
    deadline = time.monotonic() + BOOT_SECONDS
    while not ready():
        if time.monotonic() > deadline:
            tail = cluster.path("logs", f"{log}.log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"{what} not ready in {BOOT_SECONDS} s; {log}.log ends:\n{tail}")
        time.sleep(0.3)


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
        f"--cluster-cidr={POD_CIDR}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--controllers=*,-nodeipam",
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
    )


def start_node(cluster: Cluster) -> None:
    make_cgroups()
    start(
        cluster, "containerd", "containerd", f"--config={cluster.path('containerd', 'config.toml')}"
    )
    ctr = ["ctr", f"--address={cluster.containerd_socket}", "--namespace=k8s.io"]
    wait_until(
        "containerd",
        lambda: sh(*cluster.inside(*ctr, "version"), check=False).returncode == 0,
        cluster,
        "containerd",
    )
    for image in NODE_IMAGES:
        sh(*cluster.inside(*ctr, "images", "import", cluster.tool(f"{image}.tar")))
    start(
        cluster,
        "kubelet",
        cluster.tool("kubelet"),
        f"--config={cluster.path('kubelet.yaml')}",
        f"--kubeconfig={cluster.path('kubelet.kubeconfig')}",
        f"--root-dir={cluster.path('kubelet')}",
        f"--node-ip={NODE_IP}",
        f"--hostname-override={NODE_NAME}",
    )
    start(
        cluster,
        "kube-proxy",
        cluster.tool("kube-proxy"),
        f"--config={cluster.path('kube-proxy.yaml')}",
    )
    wait_until(
        "the node",
        lambda: node_ready(kubectl(cluster, "get", "node", NODE_NAME, "-o", "json", check=False)),
        cluster,
        "kubelet",
    )
    # The node holds the whole pod range (kube-controller-manager's IPAM is off: one node).
    kubectl(
        cluster,
        "patch",
        "node",
        NODE_NAME,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"podCIDR": POD_CIDR, "podCIDRs": [POD_CIDR]}}),
    )


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
    write_runtime_config(cluster)
    start_control_plane(cluster)
    start_node(cluster)
    start_dns(cluster)
    print(f"cluster up in {time.monotonic() - started:.1f} s ({cluster.directory})", flush=True)


def down(cluster: Cluster) -> None:
    """Everything `up` made goes, whatever state a run left it in; DIR's logs stay."""
    if not cluster.directory.exists():
        return
    remove_namespaces(cluster)
    for leftover in ("containerd", "kubelet", "etcd", "run-netns", "cni-ipam"):
        shutil.rmtree(cluster.path(leftover), ignore_errors=True)


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
    parser.add_argument("action", choices=("run", "up", "down"))
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--tools", type=Path, default=Path("."))
    arguments = sys.argv[1:]
    split = arguments.index("--") if "--" in arguments else len(arguments)
    options = parser.parse_args(arguments[:split])
    options.command = arguments[split + 1 :]
    cluster = Cluster(options.dir.resolve(), options.tools.resolve())
    if options.action == "run":
        sys.exit(run(cluster, options.command))
    if options.action == "up":
        up(cluster)
    else:
        down(cluster)


if __name__ == "__main__":
    main()
