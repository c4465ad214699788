"""gpuclass-hooks: `serve` runs the hooks under gunicorn; `plan` shows what they would do on a
cluster dump, offline; `check` calls a running service as Metacontroller does.

Exit codes: 0 when it ran, 2 for invalid settings, arguments or input (one line naming the problem);
`check` exits 1 when the service did not answer as it must.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from hooks.settings import Settings, describe_error

EXIT_USAGE = 2


def _load_settings(**overrides: Any) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as error:
        print(describe_error(error), file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def serve(args: argparse.Namespace) -> int:
    from hooks.serving import server

    options = server.ServeOptions(
        args.bind,
        args.workers,
        args.threads,
        args.health_port,
        args.metrics_port,
        args.admission_port,
        args.admission_threads,
        args.worker_tmp_dir,
    )
    return server.run(_load_settings(), options)


def plan(args: argparse.Namespace) -> int:
    import json
    from datetime import UTC, datetime
    from pathlib import Path

    import yaml

    from hooks.cli import offline
    from hooks.rules.selectors import RuleError
    from hooks.wire.problems import BadRequest

    settings = _load_settings(
        enabled=args.enabled,
        node_selector=args.node_selector,
        pod_selector=args.pod_selector,
        vgpu_namespace_label=args.vgpu_namespace_label,
        license_namespaces=args.license_namespaces,
    )
    try:
        inventory = offline.load([Path(f) for f in args.files], settings)
        plans = offline.run_offline(inventory, settings, datetime.now(UTC))
    except (offline.PlanInputError, RuleError, BadRequest) as error:
        print(f"plan: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.explain and args.explain not in {p.name for p in plans}:
        print(f"plan: no class named {args.explain} in the input", file=sys.stderr)
        return EXIT_USAGE
    if args.output == "table":
        sys.stdout.write(offline.render_text(plans, inventory, settings, args.explain))
        return 0
    doc = offline.document(plans, inventory, settings, args.explain)
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0


def check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hooks.cli.check import Target
    from hooks.cli.check import check as check_service

    def path(text: str | None) -> Path | None:
        return Path(text) if text else None

    target = Target(
        args.url.rstrip("/"),
        path(args.ca_file),
        path(args.token_file),
        path(args.client_cert),
        path(args.client_key),
        reach_seconds=args.reach_seconds,
    )
    problems = check_service(target)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(
        f"{target.base_url}: the hooks answer"
        + (" and refuse calls without the token" if target.token_file else "")
    )
    return 0


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError("must be true or false")
    return lowered == "true"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuclass-hooks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="serve the Metacontroller hooks")
    run.add_argument("--bind", default="0.0.0.0:8080", help="HOST:PORT (default 0.0.0.0:8080)")
    run.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="gunicorn worker processes (default 1: metrics live in one process)",
    )
    # A stalled or slow body holds a thread until its deadline: enough threads that every
    # caller that can stall (Metacontroller's workers, the API server's reviews) may, and small
    # calls still find one (docs/decisions.md). A call waiting for the memory budget holds a
    # thread, not memory; bodies below the budget's threshold, one per thread, fit its reserve.
    run.add_argument(
        "--threads", type=_positive, default=64, help="threads per worker (default 64)"
    )
    run.add_argument(
        "--health-port",
        type=int,
        default=8081,
        help="/healthz and /readyz, plain HTTP, on the --bind host (default 8081)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        help="/metrics, HTTPS when the hooks are, on the --bind host (default 9090)",
    )
    run.add_argument(
        "--admission-port",
        type=int,
        default=9443,
        help="admission reviews (the API server's webhook calls), on the --bind host, apart "
        "from the hooks: threads and memory of its own (default 9443)",
    )
    # A review's body is read by the port's event loop before it reaches a thread, and its reads
    # of the API server are bounded by its deadline: a few threads keep up with every review.
    run.add_argument(
        "--admission-threads",
        type=_positive,
        default=4,
        help="threads per worker that judge admission reviews (default 4)",
    )
    run.add_argument(
        "--worker-tmp-dir",
        default=None,
        help="gunicorn's heartbeat directory (a memory-backed emptyDir in the chart)",
    )
    run.set_defaults(handler=serve)

    offline = commands.add_parser(
        "plan",
        help="what the hooks would do on a cluster dump, offline",
        description="Reads a cluster dump (nodes, pods, namespaces, the license Secrets, the "
        "GPUClasses and the KubeVirt CR; see docs/plan.md) and runs both hooks on it. Settings "
        "as for serve (GPUCLASS_*), or the flags below. Token values are never printed.",
    )
    offline.add_argument("files", nargs="+", metavar="FILE", help="JSON or YAML: Lists or objects")
    offline.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    offline.add_argument(
        "--explain", metavar="CLASS", help="per node: counts or why not, use, free"
    )
    offline.add_argument("--enabled", type=_bool, help="GPU features on or off (GPUCLASS_ENABLED)")
    offline.add_argument("--node-selector", help="as GPUCLASS_NODE_SELECTOR")
    offline.add_argument("--pod-selector", help="as GPUCLASS_POD_SELECTOR")
    offline.add_argument("--vgpu-namespace-label", help="as GPUCLASS_VGPU_NAMESPACE_LABEL")
    offline.add_argument("--license-namespaces", help="as GPUCLASS_LICENSE_NAMESPACES")
    offline.set_defaults(handler=plan)

    probe = commands.add_parser(
        "check",
        help="call a running service's customize hook, as Metacontroller does (helm test)",
    )
    probe.add_argument("url", help="the hooks' base URL, e.g. https://gpuclass-hooks.cozy-gpu.svc")
    probe.add_argument("--ca-file", help="CA bundle the serving certificate is checked against")
    probe.add_argument("--token-file", help="the bearer token; then a call without it must get 401")
    probe.add_argument("--client-cert", help="client certificate, when the hooks require one")
    probe.add_argument("--client-key", help="its key (omit it when the certificate file holds it)")
    probe.add_argument(
        "--reach-seconds",
        type=float,
        default=45,
        help="retry a refused or unreachable first connection, or a name not resolved yet, this "
        "long (a Service routes to a pod a moment after it is Ready; the cluster's DNS caches a "
        "miss for a Service made moments earlier, for 30 s in kubeadm's CoreDNS configuration)",
    )
    probe.set_defaults(handler=check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result
