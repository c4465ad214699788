"""Calls in flight while the install changes: admission reviews sent through the API server,
Metacontroller syncs provoked by tenants' namespaces and the class changing, and a watch on the
license copies that sees every deletion, however short-lived. Each scenario that rolls, deletes or
rotates something runs inside a `Load` and then reads what every call came to."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import requests
import yaml

from hooks.rules.budget.keys import TOTAL_KEY
from tests.builders import helmrelease
from tests.e2e.cluster import GPU, NAMESPACE, RELEASE, Cluster, wait_for
from tests.e2e.steps import COPY, COPY_LABEL, licensed_setup, vm, webhook_ca_injected

ENTITLED_LABEL = "namespace.cozystack.io/vgpu"
# The tenants every scenario runs with (the `serving` fixture makes them): namespaces entitled to
# the license copy, one entitled and not in turn, a tenant with room for a VM and one without.
ENTITLED = ["tenant-entitled", "tenant-e1", "tenant-e2"]
CHURN = "tenant-churn"
FITS, EXCEEDS = "tenant-load", "tenant-a"
# Calls before, during and after each change, so the change happens with calls in flight.
SETTLE_SECONDS = 5
DENIED_BY_THE_WEBHOOK = 'admission webhook "gpu-budget.gpuclass.cozystack.io" denied the request'
# Metacontroller's line for a sync that failed, whatever failed in it (a hook call, an apply).
SYNC_FAILED = "failed to sync gpuclass-"
# Metacontroller cancels the hook calls in flight when it stops a controller to rebuild it (a
# change of the controllers' spec, as every rotation makes); the rebuilt controller syncs again
# at once. The hooks refused nothing: such lines are counted apart.
SYNC_CANCELED = "context canceled"


def message(answer: requests.Response) -> str:
    """The message of the API server's Status (JSON: its quotes are escaped in the raw text)."""
    try:
        return str(answer.json().get("message", ""))
    except ValueError:
        return answer.text


class Api:
    """The cluster's API server as the kubeconfig the tests run with reaches it."""

    def __init__(self, cluster: Cluster) -> None:
        config = yaml.safe_load((cluster.directory / "kubeconfig").read_text())
        self.server: str = config["clusters"][0]["cluster"]["server"]
        self.ca: str = config["clusters"][0]["cluster"]["certificate-authority"]
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {config['users'][0]['user']['token']}"

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", 30)
        # per request: a session's verify loses to REQUESTS_CA_BUNDLE from the environment
        return self.session.request(method, self.server + path, verify=self.ca, **kwargs)


@dataclass
class Outcomes:
    """What the calls made under load came to."""

    admission: bool = True  # whether reviews were sent
    reviews: Counter[str] = field(default_factory=Counter)
    review_failures: list[str] = field(default_factory=list)
    copies_deleted: list[str] = field(default_factory=list)
    churn_copies_created: int = 0
    churn_changes: int = 0
    watch_failures: list[str] = field(default_factory=list)
    sync_failures: list[str] = field(default_factory=list)
    syncs_canceled_by_rebuild: list[str] = field(default_factory=list)
    # A thread of the load that failed itself (the load is then not what it claims to be).
    load_errors: list[str] = field(default_factory=list)


class Load:
    """While it runs: a VM that fits and one that does not, reviewed through the API server in
    turn (dry run: nothing is stored); a namespace labelled and unlabelled, and the class
    annotated, every second (each a sync of both controllers); and a watch on the copies."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        entitled: list[str],
        churn: str,
        fits: str,
        exceeds: str,
        gpuclass: str,
        admission: bool = True,
    ) -> None:
        self.cluster = cluster
        self.api = Api(cluster)
        self.entitled, self.churn = set(entitled), churn
        self.fits, self.exceeds, self.gpuclass = fits, exceeds, gpuclass
        self.outcomes = Outcomes(admission=admission)
        self._stop = threading.Event()
        work = (self._provoke_syncs, self._watch_copies, *((self._review,) if admission else ()))
        self._threads = [
            threading.Thread(target=self._guarded, args=(part,), daemon=True) for part in work
        ]
        self._synced_failures_before = 0

    def __enter__(self) -> Load:
        self._synced_failures_before = len(self._metacontroller_sync_failures())
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        failed = self._metacontroller_sync_failures()[self._synced_failures_before :]
        self.outcomes.sync_failures = [line for line in failed if SYNC_CANCELED not in line]
        self.outcomes.syncs_canceled_by_rebuild = [line for line in failed if SYNC_CANCELED in line]

    def _guarded(self, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as error:  # reported, and the load stops
            self.outcomes.load_errors.append(f"{work.__name__}: {error!r}")
            self._stop.set()

    def _metacontroller_sync_failures(self) -> list[str]:
        done = self.cluster.kubectl(
            "logs", "-n", "metacontroller", "-l", "app.kubernetes.io/instance=metacontroller",
            "--tail=-1",
        )  # fmt: skip
        return [line for line in done.stdout.splitlines() if SYNC_FAILED in line]

    def _review(self) -> None:
        calls = 0
        while not self._stop.is_set():
            for namespace, expected in ((self.fits, "allowed"), (self.exceeds, "denied")):
                calls += 1
                try:
                    answer = self.api.request(
                        "POST",
                        f"/apis/apps.cozystack.io/v1alpha1/namespaces/{namespace}/vminstances",
                        params={"dryRun": "All"},
                        json=vm(namespace, f"load-{calls}"),
                    )
                except requests.RequestException as error:
                    self.outcomes.review_failures.append(f"{namespace}: {error}")
                    continue
                if answer.status_code == 201:
                    outcome = "allowed"
                elif answer.status_code == 403 and DENIED_BY_THE_WEBHOOK in message(answer):
                    outcome = "denied"
                else:
                    outcome = f"{answer.status_code}"
                self.outcomes.reviews[outcome] += 1
                if outcome != expected:
                    self.outcomes.review_failures.append(
                        f"{namespace}: {answer.status_code} {answer.text[:300]}"
                    )
            self._stop.wait(0.1)

    def _provoke_syncs(self) -> None:
        while not self._stop.wait(1):
            self.outcomes.churn_changes += 1
            entitled = "true" if self.outcomes.churn_changes % 2 else None
            patches = (
                (f"/api/v1/namespaces/{self.churn}", {ENTITLED_LABEL: entitled}, "labels"),
                (
                    f"/apis/cozystack.io/v1alpha1/gpuclasses/{self.gpuclass}",
                    {"e2e.gpuclass.cozystack.io/tick": str(self.outcomes.churn_changes)},
                    "annotations",
                ),
            )
            for path, values, where in patches:
                self.api.request(
                    "PATCH",
                    path,
                    data=json.dumps({"metadata": {where: values}}),
                    headers={"Content-Type": "application/merge-patch+json"},
                ).raise_for_status()

    def _watch_copies(self) -> None:
        listed = self.api.request("GET", "/api/v1/secrets", params={"labelSelector": COPY_LABEL})
        listed.raise_for_status()
        version = listed.json()["metadata"]["resourceVersion"]
        watch = {"labelSelector": COPY_LABEL, "watch": "true"}
        while not self._stop.is_set():
            # A short read timeout: the watch is resumed from the last version seen, so no
            # event is lost between two, and the thread notices the end of the load.
            try:
                with self.api.request(
                    "GET",
                    "/api/v1/secrets",
                    params={**watch, "resourceVersion": version},
                    stream=True,
                    timeout=(10, 2),
                ) as stream:
                    for line in stream.iter_lines():
                        version = self._seen(json.loads(line)) or version
            except requests.RequestException:
                continue

    def _seen(self, event: dict[str, Any]) -> str | None:
        kind, copy = event["type"], event["object"]
        if kind == "ERROR":
            self.outcomes.watch_failures.append(json.dumps(copy)[:300])
            self._stop.set()
            return None
        namespace = copy["metadata"]["namespace"]
        if copy["metadata"]["name"] == COPY:
            if kind == "DELETED" and namespace in self.entitled:
                self.outcomes.copies_deleted.append(f"{namespace} at {time.monotonic():.1f}")
            if kind == "ADDED" and namespace == self.churn:
                self.outcomes.churn_copies_created += 1
        version: str = copy["metadata"]["resourceVersion"]
        return version


def tenancy(cluster: Cluster) -> None:
    """What every scenario runs with, on an installed release: the license source and the class,
    copies in the entitled namespaces, one tenant with room for a VM and one without."""
    licensed_setup(cluster)
    namespaces = [*ENTITLED[1:], CHURN, "tenant-root", FITS, EXCEEDS]
    cluster.apply(
        *(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "labels": {ENTITLED_LABEL: "true"} if name in ENTITLED else {},
                },
            }
            for name in namespaces
        ),
        helmrelease("Tenant", "tenant-root", "load", {"resourceQuotas": {TOTAL_KEY: "1000"}}),
        helmrelease("Tenant", "tenant-root", "a", {"resourceQuotas": {TOTAL_KEY: "1"}}),
        helmrelease("VMInstance", EXCEEDS, "render", {"gpus": [{"name": GPU}]}),
    )
    for namespace in ENTITLED:
        wait_for(f"the copy in {namespace}", lambda n=namespace: cluster.secret_data(n, COPY))
    wait_for("the webhook's CA bundle", lambda: webhook_ca_injected(cluster))


def scenario_load(cluster: Cluster, *, admission: bool = True) -> Load:
    """The load every scenario runs under; without reviews where the install has no webhook."""
    return Load(
        cluster,
        entitled=ENTITLED,
        churn=CHURN,
        fits=FITS,
        exceeds=EXCEEDS,
        gpuclass="l40s",
        admission=admission,
    )


def hook_pods(cluster: Cluster) -> list[Any]:
    """The Deployment's pods, terminating ones included (not `helm test`'s)."""
    listed = cluster.get("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")
    owned = [(pod, pod["metadata"].get("ownerReferences", [])) for pod in listed["items"]]
    return [pod for pod, owners in owned if any(o["kind"] == "ReplicaSet" for o in owners)]


def images_running(cluster: Cluster) -> set[str]:
    """The images the Deployment's pods run, as their specs name them."""
    return {c["image"] for pod in hook_pods(cluster) for c in pod["spec"]["containers"]}


def serving_pods(cluster: Cluster) -> list[Any]:
    """The Deployment's pods the Service routes to: Ready and not terminating."""
    return [
        pod
        for pod in hook_pods(cluster)
        if "deletionTimestamp" not in pod["metadata"]
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod["status"].get("conditions", [])
        )
    ]


def cost_nothing(cluster: Cluster, scenario: str, outcomes: Outcomes) -> None:
    """Every review had its verdict, no sync failed, no copy went, and syncs ran throughout."""
    record = cluster.directory / "logs" / f"{scenario}.json"
    # not dataclasses.asdict: it rebuilds a Counter from its (key, count) pairs
    record.write_text(
        json.dumps({f.name: getattr(outcomes, f.name) for f in fields(outcomes)}, indent=2)
    )
    assert outcomes.load_errors == []
    assert outcomes.review_failures == []
    if outcomes.admission:
        assert outcomes.reviews["allowed"] >= 10 and outcomes.reviews["denied"] >= 10, (
            outcomes.reviews
        )
    assert outcomes.sync_failures == []
    assert outcomes.watch_failures == []
    assert outcomes.copies_deleted == []
    assert outcomes.churn_copies_created >= 2, "no license sync ran under the load"
    for namespace in ENTITLED:
        assert cluster.secret_data(namespace, COPY) is not None
