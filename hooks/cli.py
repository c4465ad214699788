"""gpuclass-hooks: `serve` runs the hooks under gunicorn.

Exit codes: 0 on a clean stop, 2 for invalid settings or arguments (one line naming the problem).
"""

from __future__ import annotations

import argparse
import logging
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


def _load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as error:
        print(describe_error(error), file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def serve(args: argparse.Namespace) -> int:
    from gunicorn.app.base import BaseApplication

    from hooks.app import create_app

    settings = _load_settings()
    logs.configure()

    class HookServer(BaseApplication):
        def load_config(self) -> None:
            options: dict[str, Any] = {
                "bind": [args.bind],
                "workers": args.workers,
                "worker_class": "gthread",
                "threads": args.threads,
                # Above Metacontroller's hook timeout (30 s in the chart): a slow large request
                # is answered rather than killed mid-way and retried from scratch.
                "timeout": 60,
                "graceful_timeout": 25,
                "keepalive": 5,
                "accesslog": None,
                "errorlog": "-",
                "loglevel": "warning",
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
            options["post_worker_init"] = drain_on_sigterm
            for key, value in options.items():
                if value is not None:
                    self.cfg.set(key, value)

        def load(self) -> Any:
            return create_app(settings)

    def drain_on_sigterm(worker: Any) -> None:
        """SIGTERM: readiness turns false at once, then, after the drain delay (time for the
        endpoints to drop this pod), gunicorn stops accepting and finishes in-flight calls
        within its graceful timeout."""
        stop = worker.handle_exit
        state = worker.wsgi.extensions["gpuclass"]["state"]

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
    run.add_argument("--threads", type=_positive, default=4, help="threads per worker (default 4)")
    run.add_argument(
        "--worker-tmp-dir",
        default=None,
        help="gunicorn's heartbeat directory (a memory-backed emptyDir in the chart)",
    )
    run.set_defaults(handler=serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
