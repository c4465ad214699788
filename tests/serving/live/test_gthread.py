"""What `hooks.serving.gthread` takes from gunicorn beyond its public API holds for the gunicorn
installed: the versions below were read and run against. The live tests beside this one use every
name through the real server (kept-alive and pipelined calls, bodies read from the socket, the
queue of calls waiting for a thread); a gunicorn upgrade fails here first, and `gthread.py` is
read again against the new version before the version is added."""

from __future__ import annotations

import inspect
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import gunicorn
from gunicorn import http as gunicorn_http
from gunicorn.config import Config
from gunicorn.workers.gthread import TConn
from gunicorn.workers.workertmp import WorkerTmp

from hooks.serving import gthread

HELD_FOR = ("27.0.1",)


def test_the_installed_gunicorn_is_one_the_private_names_were_checked_against() -> None:
    assert gunicorn.__version__ in HELD_FOR


def test_a_connection_handed_to_gthread_reads_what_was_given_back_first() -> None:
    """The head the edge read, given back, is what gthread's parser reads; what it read past a
    request is the start of the next one."""
    assert list(inspect.signature(TConn).parameters)[:4] == ["cfg", "sock", "client", "server"]
    ours, theirs = socket.socketpair()
    with ours, theirs:
        conn = gthread.connection(Config(), ours, ("127.0.0.1", 1))
        assert conn.initialized
        gthread.give_back(conn, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\n")
        theirs.sendall(b"Host: x\r\n\r\n")
        first = next(conn.parser)
        assert first.path == "/a"
        assert gthread.read_ahead(conn).startswith(b"GET /b")


def test_a_body_reader_of_gunicorn_is_found_and_kept_in_step() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbodyNEXT")
        parser = gunicorn_http.get_parser(Config(), ours, ("127.0.0.1", 1))
        request = next(parser)
        pending = gthread.PendingBody.of(request.body, 4)
        assert pending is not None
        assert pending.take_buffered(4) == b"body"
        pending.consumed(4)
        assert request.body.read() == b""  # gunicorn's count says the body is all read
        assert gthread.PendingBody.of(object(), 4) is None


def test_the_queue_of_calls_waiting_for_a_thread_is_counted() -> None:
    class Worker:
        tpool = ThreadPoolExecutor(max_workers=1)

    try:
        assert gthread.queued_calls(Worker())() == 0
    finally:
        Worker.tpool.shutdown()


def test_a_new_workers_heartbeat_is_stamped_on_the_clock_the_arbiter_reads_it_with(
    tmp_path: Path,
) -> None:
    """The arbiter's timeout check is `time.monotonic() - worker.tmp.last_update()`; a fresh
    heartbeat file holds its creation's wall-clock time, which that check never finds old."""
    config = Config()
    config.set("worker_tmp_dir", str(tmp_path))
    worker = SimpleNamespace(tmp=WorkerTmp(config))
    try:
        assert time.monotonic() - worker.tmp.last_update() < -1e6  # never "timed out"
        before = time.monotonic()
        gthread.heartbeat_from_fork(None, worker)
        assert before - 0.01 <= worker.tmp.last_update() <= time.monotonic() + 0.01
    finally:
        worker.tmp.close()
