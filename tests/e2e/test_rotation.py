"""docs/operating.md's rotations, run as written on a real cluster while Metacontroller drives
both controllers and the API server sends admission reviews: the token, a renewal of the serving
certificate, and the CA. None may cost a call or a copy while it runs (`tests/e2e/load.py`), and
afterwards the controllers must keep converging with only the new credential accepted.

Each writes what its calls came to in `<GPUCLASS_E2E_DIR>/logs/<scenario>-during.json` and
`-after.json`."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path

from hooks.wire.certificates import not_after
from tests.e2e.cluster import NAMESPACE, RELEASE, Cluster, CommandFailed, wait_for
from tests.e2e.load import SETTLE_SECONDS, cost_nothing, scenario_load, serving_pods
from tests.e2e.steps import OPERATING, doc_block, run_block, upgrade

# Long enough for syncs of both controllers and a few dozen reviews, all with the new credential.
AFTER_SECONDS = 15
TOKEN_SECRET = f"{RELEASE}-hook-token"
TLS_SECRET = f"{RELEASE}-tls"


def rotate(cluster: Cluster, scenario: str, block: str, workdir: Path) -> None:
    """A documented rotation under load, then the controllers and the webhook with what it left."""
    with scenario_load(cluster) as during:
        time.sleep(SETTLE_SECONDS)
        run_block(cluster, block, workdir)
        time.sleep(SETTLE_SECONDS)
    cost_nothing(cluster, f"{scenario}-during", during.outcomes)
    with scenario_load(cluster) as after:
        time.sleep(AFTER_SECONDS)
    cost_nothing(cluster, f"{scenario}-after", after.outcomes)


def renew(cluster: Cluster, certificate: str) -> None:
    """What `cmctl renew` does, and cert-manager itself `renewBefore` the end."""
    issuing = {
        "type": "Issuing",
        "status": "True",
        "reason": "ManuallyTriggered",
        "message": "e2e renewal",
    }
    cluster.kubectl(
        "-n", NAMESPACE, "patch", "certificate", certificate, "--subresource", "status",
        "--type", "json", "-p",
        json.dumps([{"op": "add", "path": "/status/conditions/-", "value": issuing}]),
    )  # fmt: skip


def served_certificates(cluster: Cluster) -> set[str]:
    """The serving certificate each serving hook pod holds in its Secret volume."""
    return {
        cluster.kubectl(
            "-n", NAMESPACE, "exec", pod["metadata"]["name"], "--",
            "cat", "/etc/gpuclass-hooks/tls/tls.crt",
        ).stdout
        for pod in serving_pods(cluster)
    }  # fmt: skip


def test_a_token_rotation_as_documented_refuses_no_call(
    cluster: Cluster, serving: None, tmp_path: Path
) -> None:
    before = cluster.secret_data(NAMESPACE, TOKEN_SECRET)
    assert before is not None
    rotate(cluster, "token-rotation", doc_block("**Token**", OPERATING), tmp_path)
    after = cluster.secret_data(NAMESPACE, TOKEN_SECRET)
    assert after is not None and after["token"] != before["token"]
    assert after["accepted-tokens"] == after["token"]


def test_a_renewed_serving_certificate_refuses_no_call(
    cluster: Cluster, serving: None, tmp_path: Path
) -> None:
    """What cert-manager does `renewBefore` the end: a new certificate from the same CA, which the
    pods serve once the kubelet has swapped their Secret volume. Nothing to run but the trigger."""
    before = (cluster.secret_data(NAMESPACE, TLS_SECRET) or {})["tls.crt"]
    with scenario_load(cluster) as during:
        time.sleep(SETTLE_SECONDS)
        renew(cluster, TLS_SECRET)
        renewed = wait_for(
            "the renewed certificate",
            lambda: (
                (cluster.secret_data(NAMESPACE, TLS_SECRET) or {}).get("tls.crt") != before
                and cluster.secret_data(NAMESPACE, TLS_SECRET)
            ),
        )["tls.crt"].decode()
        wait_for(
            "every pod holding it",
            lambda: served_certificates(cluster) == {renewed},
            seconds=180,
        )
        time.sleep(SETTLE_SECONDS)
    cost_nothing(cluster, "leaf-renewal", during.outcomes)


def test_a_ca_rotation_as_documented_refuses_no_call(
    cluster: Cluster, serving: None, tmp_path: Path
) -> None:
    old_ca = (cluster.secret_data(NAMESPACE, f"{RELEASE}-ca") or {})["tls.crt"]
    rotate(cluster, "ca-rotation", doc_block("**CA**", OPERATING), tmp_path)
    new_ca = (cluster.secret_data(NAMESPACE, f"{RELEASE}-ca") or {})["tls.crt"]
    assert new_ca != old_ca
    assert (cluster.secret_data(NAMESPACE, TLS_SECRET) or {})["ca.crt"] == new_ca
    controller = cluster.get("compositecontroller", "gpuclass-status")
    for hook in controller["spec"]["hooks"].values():
        assert hook["webhook"]["caBundle"] == {"inline": new_ca.decode()}
    webhooks = cluster.get("validatingwebhookconfiguration", RELEASE)["webhooks"]
    assert {base64.b64decode(w["clientConfig"]["caBundle"]) for w in webhooks} == {new_ca}


# Run inside a hook pod: its own /metrics, with the token and the CA it holds, as the chart's
# scrape objects send them (metrics.requireAuth is on by default).
SCRAPE_OWN_METRICS = """
import ssl, urllib.request
token = open("/etc/gpuclass-hooks/auth/accepted-tokens").read().split()[0]
context = ssl.create_default_context(cafile="/etc/gpuclass-hooks/tls/ca.crt")
context.check_hostname = False
request = urllib.request.Request(
    "https://127.0.0.1:9090/metrics", headers={"Authorization": "Bearer " + token}
)
print(urllib.request.urlopen(request, context=context, timeout=10).read().decode())
"""


def presented_client_certificate_ends(cluster: Cluster) -> set[float] | None:
    """What each serving hook pod last saw Metacontroller present, from its metrics; None while
    a pod is out of reach (a rollout can end one between the listing and the scrape)."""
    ends = set()
    for pod in serving_pods(cluster):
        name = pod["metadata"]["name"]
        try:
            scraped = cluster.kubectl(
                "-n", NAMESPACE, "exec", name, "--", "/opt/hooks/bin/python", "-c",
                SCRAPE_OWN_METRICS, timeout=30,
            ).stdout  # fmt: skip
        except (CommandFailed, subprocess.TimeoutExpired):
            return None
        for line in scraped.splitlines():
            if line.startswith("cozystack_gpu_hook_client_certificate_expiry_timestamp_seconds "):
                ends.add(float(line.split()[-1]))
    return ends


def test_a_client_certificate_rotation_as_documented_refuses_no_call(
    cluster: Cluster, serving: None, tmp_path: Path
) -> None:
    """With `tls.clientAuth` (admission off: the API server presents no client certificate):
    cert-manager renews Metacontroller's certificate, and the documented upgrade makes
    Metacontroller present the new one."""
    client_secret = f"{RELEASE}-client"
    upgrade(cluster, "admission.enabled=false", "tls.clientAuth.enabled=true")
    first = wait_for(
        "the client certificate", lambda: cluster.secret_data(NAMESPACE, client_secret)
    )
    upgrade(cluster)  # docs/operating.md: once the Secret is issued, the same upgrade once more
    wait_for(
        "Metacontroller presenting it",
        lambda: presented_client_certificate_ends(cluster) == {not_after(first["tls.crt"])},
        seconds=180,
    )
    with scenario_load(cluster, admission=False) as during:
        time.sleep(SETTLE_SECONDS)
        renew(cluster, client_secret)
        renewed = wait_for(
            "the renewed client certificate",
            lambda: (
                (cluster.secret_data(NAMESPACE, client_secret) or {}).get("tls.crt")
                != first["tls.crt"]
                and cluster.secret_data(NAMESPACE, client_secret)
            ),
        )
        run_block(cluster, doc_block("**Client certificate**", OPERATING), tmp_path)
        wait_for(
            "Metacontroller presenting the renewed one",
            lambda: presented_client_certificate_ends(cluster) == {not_after(renewed["tls.crt"])},
            seconds=180,
        )
        time.sleep(SETTLE_SECONDS)
    cost_nothing(cluster, "client-certificate-rotation", during.outcomes)
