"""gpuclass-hooks: `serve` runs the hooks under gunicorn; `plan` shows what they would do on a
cluster dump, offline; `check` calls a running service as Metacontroller does.

Exit codes: 0 when it ran, 2 for invalid settings, arguments or input (one line naming the problem);
`check` exits 1 when the service did not answer as it must.
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import ssl
import sys
import threading
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from hooks import logs
from hooks.settings import Settings, describe_error

EXIT_USAGE = 2
SWITCH_INTERVAL_SECONDS = 0.001  # see serve()


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


def graceful_timeout_seconds(settings: Settings) -> float:
    """How long a stopping worker may take from SIGTERM: every call accepted before it stops
    accepting is answered within it."""
    return (
        settings.shutdown_delay_seconds
        + settings.header_timeout_seconds
        + settings.hook_timeout_seconds
    )


def serve(args: argparse.Namespace) -> int:
    from gunicorn.app.base import BaseApplication
    from gunicorn.glogging import Logger

    class JsonGunicornLogger(Logger):
        """gunicorn's own lines (boot, worker exits, timeouts) in the service's JSON format."""

        def setup(self, cfg: Any) -> None:
            super().setup(cfg)
            for handler in self.error_log.handlers:
                handler.setFormatter(logs.JsonFormatter())

    from hooks import forked, listeners
    from hooks.app import create_app, stale_after_seconds
    from hooks.auth import TokenFile
    from hooks.guard import Guard
    from hooks.metrics import Metrics
    from hooks.worker import HookWorker

    settings = _load_settings()
    # Made before gunicorn forks: each worker holds its own copy, which its readiness probe
    # reads and its SIGTERM handler drains.
    state = listeners.ServiceState()
    host = args.bind.rpartition(":")[0].strip("[]") or "0.0.0.0"
    exported: list[Metrics] = []  # the worker's, made when it loads the app
    tokens = TokenFile(settings.auth_token_file) if settings.auth_token_file else None
    guard = Guard(settings, tokens)
    logs.configure(settings.log_level)
    # Large calls are computed in other processes, but the threads reading their bodies still run
    # Python between reads, and a small call that needs the interpreter waits up to one switch
    # interval each time it does. 1 ms instead of 5 keeps customize hooks, license syncs and
    # admission reviews quick meanwhile (`make bench-load` measures it; docs/scale.md).
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)

    class HookServer(BaseApplication):
        def load_config(self) -> None:
            options: dict[str, Any] = {
                "bind": [args.bind],
                "workers": args.workers,
                "worker_class": HookWorker,
                "threads": args.threads,
                # A worker whose main loop is stuck this long is restarted: beyond the hook
                # timeout, so that a slow large call is answered rather than killed mid-way.
                "timeout": math.ceil(2 * settings.hook_timeout_seconds),
                # Counted from SIGTERM: the drain delay, during which the worker still accepts,
                # then a call accepted last has its head's deadline and the hook timeout.
                "graceful_timeout": math.ceil(graceful_timeout_seconds(settings)),
                "keepalive": 5,
                "accesslog": None,
                "errorlog": "-",
                "loglevel": settings.log_level,
                "logger_class": JsonGunicornLogger,
                "worker_tmp_dir": args.worker_tmp_dir,
            }
            if settings.tls_cert_file is not None:
                options.update(
                    certfile=str(settings.tls_cert_file), keyfile=str(settings.tls_key_file)
                )
            if settings.tls_client_ca_file is not None:
                options.update(
                    ca_certs=str(settings.tls_client_ca_file), cert_reqs=ssl.CERT_REQUIRED
                )
            options["post_worker_init"] = start_worker
            for key, value in options.items():
                if value is not None:
                    self.cfg.set(key, value)

        def load(self) -> Any:
            exported.append(Metrics(stale_after_seconds(settings)))
            return create_app(settings, metrics=exported[-1], guard=guard)

    def start_worker(worker: Any) -> None:
        drain_on_sigterm(worker)
        metrics = exported[-1]
        worker.serve_edge(settings, guard, metrics)
        # gthread's pool of threads: its queue holds the calls that wait for a thread.
        metrics.watch_threads(args.threads, worker.tpool._work_queue.qsize)
        # Each worker has its own fork server for large calls, started before the first one
        # arrives (which would otherwise wait for it to import the hooks, about a second), and
        # before the probes answer: a worker that reports ready can compute a large call.
        if forked.supported():
            forked.start()
        listeners.start(settings, host, args.health_port, args.metrics_port, state, metrics)

    def drain_on_sigterm(worker: Any) -> None:
        """SIGTERM: readiness turns false at once, then, after the drain delay (time for the
        endpoints to drop this pod), the worker stops accepting (new connections are refused)
        and finishes the calls it accepted within its graceful timeout."""
        stop = worker.handle_exit

        def on_sigterm(signum: int, frame: Any) -> None:
            state.drain()
            timer = threading.Timer(settings.shutdown_delay_seconds, stop, args=(signum, frame))
            timer.daemon = True
            timer.start()

        signal.signal(signal.SIGTERM, on_sigterm)

    if args.workers > 1:
        logs.log(
            logging.WARNING,
            "several worker processes: each keeps its own metrics; scrapes see one of them",
            workers=args.workers,
        )

    HookServer().run()
    return 0


def plan(args: argparse.Namespace) -> int:
    import json
    from datetime import UTC, datetime
    from pathlib import Path

    import yaml

    from hooks import offline
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
        sys.stdout.write(offline.render_text(plans, inventory, args.explain))
        return 0
    doc = offline.document(plans, inventory, args.explain)
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0


def check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hooks.check import Target
    from hooks.check import check as check_service

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
        default=15,
        help="retry a refused or unreachable first connection this long (a Service routes to a "
        "pod a moment after it is Ready)",
    )
    probe.set_defaults(handler=check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
