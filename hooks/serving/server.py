"""The service under gunicorn: one arbiter, `HookWorker` processes, each with its edge, its fork
server for large calls, its admission port (`hooks.serving.webhook`) and its probe and metrics
listeners, every TLS port serving the one pair the worker reads."""

from __future__ import annotations

import logging
import math
import signal
import ssl
import sys
import threading
from dataclasses import dataclass
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger

from hooks.serving import apart, gthread, listeners, logs, webhook
from hooks.serving.app import create_app, settings_metrics
from hooks.serving.auth import TokenFile
from hooks.serving.credentials import CredentialWatch, Watched
from hooks.serving.edge import TlsSource
from hooks.serving.guard import Guard
from hooks.serving.metrics import Metrics
from hooks.serving.worker import LISTEN_BACKLOG, HookWorker
from hooks.settings import Settings

SWITCH_INTERVAL_SECONDS = 0.001  # see run()


@dataclass(frozen=True)
class ServeOptions:
    """What `gpuclass-hooks serve` takes besides the settings."""

    bind: str
    workers: int
    threads: int
    health_port: int
    metrics_port: int
    admission_port: int
    admission_threads: int
    worker_tmp_dir: str | None = None

    @property
    def host(self) -> str:
        return self.bind.rpartition(":")[0].strip("[]") or "0.0.0.0"


def graceful_timeout_seconds(settings: Settings) -> float:
    """How long a stopping worker may take from SIGTERM: every call accepted before it stops
    accepting is answered within it."""
    return (
        settings.shutdown_delay_seconds
        + settings.header_timeout_seconds
        + settings.hook_timeout_seconds
    )


class JsonGunicornLogger(Logger):
    """gunicorn's own lines (boot, worker exits, timeouts) in the service's JSON format."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        # Through the same queue as the service's lines: a stalled stderr never holds a worker.
        queued = logs.QueuedStream(logs.STDERR)
        queued.setFormatter(logs.JsonFormatter())
        self.error_log.handlers = [queued]


def gunicorn_options(settings: Settings, options: ServeOptions) -> dict[str, Any]:
    """gunicorn's settings for the service."""
    config: dict[str, Any] = {
        "bind": [options.bind],
        "workers": options.workers,
        "worker_class": HookWorker,
        "threads": options.threads,
        # A worker whose main loop is stuck this long is restarted: beyond the hook timeout, so
        # that a slow large call is answered rather than killed mid-way.
        "timeout": math.ceil(2 * settings.hook_timeout_seconds),
        # Counted from SIGTERM: the drain delay, during which the worker still accepts, then a
        # call accepted last has its head's deadline and the hook timeout.
        "graceful_timeout": math.ceil(graceful_timeout_seconds(settings)),
        "keepalive": 5,
        "backlog": LISTEN_BACKLOG,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": settings.log_level,
        "logger_class": JsonGunicornLogger,
        # gunicorn's control socket lets whoever shares the pod's user stop or rescale the
        # workers, from a thread in the arbiter that every worker is forked beside: the service
        # is managed by its Deployment alone.
        "control_socket_disable": True,
        "worker_tmp_dir": options.worker_tmp_dir,
    }
    if settings.tls_cert_file is not None:
        config.update(certfile=str(settings.tls_cert_file), keyfile=str(settings.tls_key_file))
    if settings.tls_client_ca_file is not None:
        config.update(ca_certs=str(settings.tls_client_ca_file), cert_reqs=ssl.CERT_REQUIRED)
    return config


class HookServer(BaseApplication):
    """gunicorn embedded: the app is made in each worker, with metrics of its own."""

    def __init__(self, settings: Settings, options: ServeOptions) -> None:
        self.settings, self.options = settings, options
        # Made before gunicorn forks: each worker holds its own copy, which its readiness probe
        # reads and its SIGTERM handler drains.
        self.state = listeners.ServiceState()
        tokens = TokenFile(settings.auth_token_file) if settings.auth_token_file else None
        self.guard = Guard(settings, tokens)
        self.metrics: Metrics | None = None  # the worker's, made when it loads the app
        self.app: Any = None  # the worker's, made when it loads the app
        super().__init__()

    def load_config(self) -> None:
        config = gunicorn_options(self.settings, self.options)
        config["post_worker_init"] = self.start_worker
        # A worker whose boot does not finish within the timeout is replaced like a stuck one.
        config["pre_fork"] = gthread.heartbeat_from_fork
        for key, value in config.items():
            if value is not None:
                self.cfg.set(key, value)

    def load(self) -> Any:
        self.metrics = settings_metrics(self.settings)
        self.app = create_app(self.settings, metrics=self.metrics, guard=self.guard)
        return self.app

    def start_worker(self, worker: Any) -> None:
        settings, options, metrics = self.settings, self.options, self.metrics
        assert metrics is not None, "gunicorn loads the app before it starts the worker"
        self.drain_on_sigterm(worker)
        tls = listeners.server_tls(settings)
        worker.serve_edge(settings, self.guard, metrics, tls)
        watch = credential_watch(self.guard.tokens, tls)
        metrics.watch_credentials(watch)
        self.state.unready = watch.unready
        watch.start()
        metrics.watch_threads(options.threads, gthread.queued_calls(worker))
        # Each worker has its own fork server for large calls, started before the first one
        # arrives (which would otherwise wait for it to import the hooks), and before the probes
        # answer: a worker that reports ready can compute a large call.
        if apart.supported():
            apart.start()
        admission = webhook.Webhook(
            settings,
            options.host,
            options.admission_port,
            app=self.app,
            guard=self.guard,
            metrics=metrics,
            tls=tls,
            threads=options.admission_threads,
            state=self.state,
        )
        worker.drain_with(admission)
        _, scrape = listeners.start(
            settings,
            options.host,
            options.health_port,
            options.metrics_port,
            self.state,
            metrics,
            tls,
        )
        # The health port's own listener answers the probes: if it stops, they fail anyway.
        self.state.listeners += [admission, scrape]

    def drain_on_sigterm(self, worker: Any) -> None:
        """SIGTERM: readiness turns false at once, then, after the drain delay (time for the
        endpoints to drop this pod), the worker stops accepting (new connections are refused)
        and finishes the calls it accepted within its graceful timeout."""
        stop = worker.handle_exit
        state, delay = self.state, self.settings.shutdown_delay_seconds

        def on_sigterm(signum: int, frame: Any) -> None:
            state.drain()
            timer = threading.Timer(delay, stop, args=(signum, frame))
            timer.daemon = True
            timer.start()

        signal.signal(signal.SIGTERM, on_sigterm)


def credential_watch(tokens: TokenFile | None, tls: TlsSource | None) -> CredentialWatch:
    """The worker's credential files, watched: the hook token file, the serving pair."""
    watched = []
    if tokens is not None:
        watched.append(Watched("token", str(tokens.path), tokens.problem))
    if tls is not None:
        source = tls

        def pair_problem() -> str | None:
            source.context()  # loads the files again if they changed
            return source.problem

        watched.append(Watched("serving_pair", str(source.files[0]), pair_problem))
    return CredentialWatch(watched)


def run(settings: Settings, options: ServeOptions) -> int:
    logs.configure(settings.log_level)
    # Large calls are computed in other processes, but the threads reading their bodies still run
    # Python between reads, and a small call that needs the interpreter waits up to one switch
    # interval each time it does: a shorter interval keeps customize hooks, license syncs and
    # admission reviews quick meanwhile (`make bench-load` measures it; docs/scale.md).
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    if options.workers > 1:
        logs.log(
            logging.WARNING,
            "several worker processes: each keeps its own metrics; scrapes see one of them",
            workers=options.workers,
        )
    HookServer(settings, options).run()
    return 0
