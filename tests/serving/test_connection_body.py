"""Bodies read straight from gunicorn's connection (`hooks.serving.body.body_chunks` under
gunicorn), with gunicorn's own parser on a socket pair: what it read ahead and what comes after
the body must be left as gunicorn expects them, or the next request on a kept-alive connection is
lost."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
from flask import Flask
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser
from werkzeug.exceptions import ClientDisconnected, RequestTimeout

from hooks.serving.body import CHUNK_BYTES, body_chunks, joined
from hooks.serving.http import begin_call

# Larger than one piece, so that the buffer is filled again; and small enough that gunicorn's
# read of the headers took all of it with the next request.
SIZES = [100, 3 * CHUNK_BYTES + 12345]


def request_bytes(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@contextmanager
def gunicorn_request(sent: bytes) -> Iterator[tuple[Any, RequestParser, socket.socket]]:
    """gunicorn's first request parsed from what a client sent (in a thread of its own, as it may
    exceed the socket's buffer), its parser, and the client's end (open until the test ends)."""
    client, server = socket.socketpair()
    server.settimeout(5)  # a test that gets the reading wrong fails instead of waiting forever

    def send() -> None:
        with suppress(OSError):  # the test ended before all of it was read
            client.sendall(sent)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    parser = RequestParser(Config(), server, ("127.0.0.1", 0))
    try:
        yield next(parser), parser, client
    finally:
        server.close()
        client.close()
        sender.join(timeout=5)


@contextmanager
def served(gunicorn_request: Any, connection: socket.socket, length: int) -> Iterator[None]:
    """A Flask request context as gunicorn's WSGI environment makes it, its call begun."""
    with Flask(__name__).test_request_context(
        method="POST",
        environ_overrides={"wsgi.input": gunicorn_request.body, "gunicorn.socket": connection},
        content_length=length,
    ):
        begin_call()
        yield


@pytest.mark.parametrize("size", SIZES)
def test_a_body_read_from_the_connection_is_the_body_and_leaves_the_next_request_whole(
    size: int,
) -> None:
    first, second = os.urandom(size), b'{"next": true}'
    sent = request_bytes("/first", first) + request_bytes("/second", second)
    with gunicorn_request(sent) as (request, parser, _):
        with served(request, parser.unreader.sock, size):
            assert joined(body_chunks(size, 5)) == first
        following = next(parser)  # gunicorn drains what it believes is left of the first body
        assert following.path == "/second"
        assert following.body.read() == second


def test_pieces_read_from_the_connection_are_read_from_the_socket_not_through_gunicorn() -> None:
    size = SIZES[-1]
    body = os.urandom(size)
    with gunicorn_request(request_bytes("/large", body)) as (request, parser, _):
        request.body.read = None  # gunicorn's stream must not be read: it copies every byte
        with served(request, parser.unreader.sock, size):
            pieces = [bytes(piece) for piece in body_chunks(size, 5)]
    assert b"".join(pieces) == body
    assert max(len(piece) for piece in pieces) <= CHUNK_BYTES


def test_a_body_gunicorn_began_to_read_is_read_through_gunicorn() -> None:
    body = os.urandom(1000)
    with gunicorn_request(request_bytes("/begun", body)) as (request, parser, _):
        begun = request.body.read(10)
        with served(request, parser.unreader.sock, 1000):
            assert begun + joined(body_chunks(990, 5)) == body


class OlderUnreader:
    """gunicorn's unreader as a gunicorn without one of the methods the connection's reading
    needs would have it."""

    def __init__(self, unreader: Any, missing: str) -> None:
        self._unreader, self._missing = unreader, missing

    def __getattr__(self, name: str) -> Any:
        if name == self._missing:
            raise AttributeError(name)
        return getattr(self._unreader, name)


@pytest.mark.parametrize("missing", ["take_buffered", "unread"])
def test_a_gunicorn_without_what_the_connection_needs_is_read_through_its_stream(
    missing: str,
) -> None:
    body = os.urandom(1000)
    with gunicorn_request(request_bytes("/older", body)) as (request, parser, _):
        reader = request.body.reader
        reader.unreader = OlderUnreader(reader.unreader, missing)
        through_stream = []
        stream_read = request.body.read

        def read(size: int = -1) -> bytes:
            through_stream.append(size)
            return bytes(stream_read(size))

        request.body.read = read
        with served(request, parser.unreader.sock, 1000):
            assert joined(body_chunks(1000, 5)) == body
    assert through_stream


def test_a_client_gone_mid_body_leaves_gunicorn_nothing_to_parse() -> None:
    size = SIZES[-1]
    sent = request_bytes("/cut", os.urandom(size))[: -size // 2]
    with gunicorn_request(sent) as (request, parser, client):
        client.close()
        with served(request, parser.unreader.sock, size), pytest.raises(ClientDisconnected):
            joined(body_chunks(size, 5))
        with pytest.raises(StopIteration):
            next(parser)


def test_a_body_stalled_past_its_deadline_times_out_and_ends_the_connection() -> None:
    size = SIZES[-1]
    sent = request_bytes("/stalled", os.urandom(size))[: -size // 2]
    with gunicorn_request(sent) as (request, parser, _):
        with served(request, parser.unreader.sock, size), pytest.raises(RequestTimeout):
            joined(body_chunks(size, 0.2))
        with pytest.raises(StopIteration):
            next(parser)
