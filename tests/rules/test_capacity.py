from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hooks.rules.capacity import compute_capacity, effective_request, pod_counts
from hooks.wire.gpuclass import Toleration
from hooks.wire.kube import Node, Pod
from tests.builders import GPU, as_wire, container, node, pod


def capacity(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], tolerations=()):  # type: ignore[no-untyped-def]
    return compute_capacity(
        [as_wire(n, Node) for n in nodes],
        [as_wire(p, Pod) for p in pods],
        GPU,
        [Toleration.model_validate(t) for t in tolerations],
    )


def request_of(spec_pod: dict[str, Any]) -> int:
    return effective_request(as_wire(spec_pod, Pod), GPU)


def test_free_is_allocatable_minus_used_over_eligible_nodes() -> None:
    result = capacity(
        [node("gpu-1", gpus=4), node("gpu-2", gpus=2), node("cpu-1", gpus=None)],
        [pod("vm-1", node_name="gpu-1", gpus=1), pod("vm-2", node_name="gpu-1", gpus=2)],
    )
    assert (result.free, result.max_free_per_node) == (3, 2)
    assert [n.name for n in result.nodes] == ["gpu-1", "gpu-2"]


def test_node_free_never_goes_below_zero() -> None:
    result = capacity([node("gpu-1", gpus=1), node("gpu-2", gpus=2)], [pod("a", gpus=3)])
    assert (result.free, result.max_free_per_node) == (2, 2)


def test_max_free_per_node_is_zero_without_eligible_nodes() -> None:
    result = capacity([node("gpu-1", ready="False")], [])
    assert (result.free, result.max_free_per_node) == (0, 0)
    assert result.advertised


def test_ineligible_nodes_do_not_count_but_stay_advertised() -> None:
    result = capacity(
        [
            node("gpu-1", unschedulable=True),
            node("gpu-2", taints=[{"key": "k", "effect": "NoSchedule"}]),
        ],
        [],
    )
    assert result.free == 0
    assert result.advertised
    assert result.totals(eligible=False) == (8, 0)


def test_tolerated_taint_makes_node_count() -> None:
    nodes = [node("gpu-1", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])]
    assert capacity(nodes, [], [{"key": "k", "operator": "Equal", "value": "v"}]).free == 4


def test_pods_count_only_when_bound_and_not_finished() -> None:
    assert pod_counts(as_wire(pod("a"), Pod))
    assert pod_counts(as_wire(pod("a", phase="Pending"), Pod))
    assert not pod_counts(as_wire(pod("a", node_name=None), Pod))
    assert not pod_counts(as_wire(pod("a", phase="Succeeded"), Pod))
    assert not pod_counts(as_wire(pod("a", phase="Failed"), Pod))


def test_terminating_pods_still_count() -> None:
    assert capacity([node("gpu-1")], [pod("a", terminating=True)]).free == 3


def test_unbound_and_finished_pods_free_their_units() -> None:
    pods = [pod("a", node_name=None), pod("b", phase="Succeeded"), pod("c", phase="Failed")]
    assert capacity([node("gpu-1")], pods).free == 4


def test_pods_on_other_nodes_do_not_count() -> None:
    assert capacity([node("gpu-1")], [pod("a", node_name="gpu-9")]).free == 4


def test_requests_fall_back_to_limits() -> None:
    only_limits = pod("a", containers=[container(limits={GPU: "2"})])
    assert request_of(only_limits) == 2
    both = pod("a", containers=[container(requests={GPU: "1"}, limits={GPU: "3"})])
    assert request_of(both) == 1
    neither = pod("a", containers=[container(requests={"cpu": "1"})])
    assert request_of(neither) == 0


def test_effective_request_sums_app_containers() -> None:
    spec_pod = pod(
        "a", containers=[container("a", requests={GPU: "1"}), container("b", requests={GPU: "2"})]
    )
    assert request_of(spec_pod) == 3


def test_effective_request_takes_the_init_peak_when_larger() -> None:
    spec_pod = pod(
        "a",
        containers=[container(requests={GPU: "1"})],
        init_containers=[
            container("init", requests={GPU: "3"}),
            container("init2", requests={GPU: "2"}),
        ],
    )
    assert request_of(spec_pod) == 3


def test_effective_request_counts_sidecars_in_app_and_init_phases() -> None:
    spec_pod = pod(
        "a",
        containers=[container(requests={GPU: "1"})],
        init_containers=[
            container("sidecar", requests={GPU: "1"}, restart_policy="Always"),
            container("init", requests={GPU: "2"}),
        ],
    )
    # app = 1 + 1 (sidecar); init peak = 2 + 1 (sidecar running beside the later init container)
    assert request_of(spec_pod) == 3


def test_effective_request_adds_overhead() -> None:
    assert request_of(pod("a", gpus=1, overhead={GPU: "1"})) == 2


def test_malformed_quantity_counts_as_zero_and_is_reported() -> None:
    result = capacity(
        [node("gpu-1", gpus="lots"), node("gpu-2", gpus=2)],
        [pod("a", node_name="gpu-2", gpus="-1"), pod("b", node_name="gpu-2", gpus=1)],
    )
    assert (result.free, result.max_free_per_node) == (1, 1)
    assert sorted((o.kind, o.name) for o in result.invalid) == [
        ("Node", "gpu-1"),
        ("Pod", "tenant-a/a"),
    ]
    assert all("lots" not in o.reason for o in result.invalid)


def test_resource_advertised_only_through_capacity() -> None:
    only_capacity, only_allocatable = node("a", gpus=2), node("b", gpus=2)
    del only_capacity["status"]["allocatable"][GPU]
    del only_allocatable["status"]["capacity"][GPU]
    through_capacity = capacity([only_capacity], [])
    assert through_capacity.advertised and through_capacity.free == 0
    # allocatable alone is not advertising (name drift shows in capacity first); its units count
    through_allocatable = capacity([only_allocatable], [])
    assert not through_allocatable.advertised and through_allocatable.free == 2
    assert not capacity([node("cpu", gpus=None)], []).advertised


def test_one_advertising_node_among_others_advertises_the_resource() -> None:
    """Any node listing the resource in its capacity advertises it, wherever it comes in the
    list: nodes without the resource, or with it in allocatable only, change nothing."""
    gpu, cpu, allocatable_only = node("gpu", gpus=2), node("cpu", gpus=None), node("b", gpus=2)
    del allocatable_only["status"]["capacity"][GPU]
    for nodes in ([gpu, cpu], [cpu, gpu], [gpu, allocatable_only], [allocatable_only, gpu, cpu]):
        assert capacity(nodes, []).advertised, [n["metadata"]["name"] for n in nodes]


requests = st.integers(min_value=0, max_value=8)


@given(
    st.lists(requests, max_size=3),
    st.lists(st.tuples(requests, st.booleans()), max_size=4),
    requests,
)
def test_effective_request_is_at_least_the_app_sum_and_every_init_step(
    apps: list[int], inits: list[tuple[int, bool]], overhead: int
) -> None:
    spec_pod = pod(
        "p",
        containers=[container(f"c{i}", requests={GPU: str(r)}) for i, r in enumerate(apps)],
        init_containers=[
            container(f"i{i}", requests={GPU: str(r)}, restart_policy="Always" if sidecar else None)
            for i, (r, sidecar) in enumerate(inits)
        ],
        overhead={GPU: str(overhead)},
    )
    effective = request_of(spec_pod)
    sidecar_total = sum(r for r, sidecar in inits if sidecar)
    assert effective >= sum(apps) + sidecar_total + overhead
    assert all(effective >= r + overhead for r, _ in inits)


@given(st.lists(requests, max_size=3), requests)
def test_a_sidecar_request_counts_in_both_app_and_init_phases(
    apps: list[int], sidecar: int
) -> None:
    base = pod(
        "p", containers=[container(f"c{i}", requests={GPU: str(r)}) for i, r in enumerate(apps)]
    )
    with_sidecar = dict(
        base,
        spec=dict(
            base["spec"],
            initContainers=[
                container("side", requests={GPU: str(sidecar)}, restart_policy="Always"),
                container("late-init", requests={GPU: "1"}),
            ],
        ),
    )
    assert request_of(with_sidecar) == max(sum(apps) + sidecar, sidecar + 1)


def test_sidecars_started_before_an_init_container_all_hold_their_units() -> None:
    sidecar = {"name": "s", "restartPolicy": "Always", "resources": {"requests": {GPU: "1"}}}
    spec_pod = pod("p", gpus=1)
    spec_pod["spec"]["initContainers"] = [
        dict(sidecar, name="s1"),
        dict(sidecar, name="s2"),
        {"name": "i", "resources": {"requests": {GPU: "2"}}},
    ]
    # containers 1 + sidecars 2 = 3; while i runs: 2 + both sidecars = 4
    assert request_of(spec_pod) == 4


def test_a_node_without_the_resource_in_allocatable_offers_nothing() -> None:
    only_capacity = node("a", gpus=2)
    del only_capacity["status"]["allocatable"][GPU]
    [listed] = capacity([only_capacity], []).nodes
    assert (listed.allocatable, listed.free) == (0, 0)


def test_pods_on_a_node_are_named_with_their_namespace() -> None:
    [listed] = capacity([node("gpu-1", gpus=4)], [pod("vm", node_name="gpu-1", gpus=1)]).nodes
    assert [(use.pod, use.units) for use in listed.pods] == [("tenant-a/vm", 1)]
    assert capacity([node("cpu", gpus=None)], []).advertised is False
