"""Structured logs: one JSON object per line, fields given explicitly, never object contents."""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from typing import Any

LOGGER = logging.getLogger("gpuclass_hooks")


class JsonFormatter(logging.Formatter):
    """Our lines and the serving stack's (gunicorn's) alike: a line of another logger names it,
    and an exception is its type and last frames (its message may quote input)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        if record.name != LOGGER.name:
            line["logger"] = record.name
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            line["error"] = type(error).__name__
            line["frames"] = traceback.format_tb(error.__traceback__)[-3:]
        line.update(getattr(record, "fields", {}))
        return json.dumps(line, separators=(",", ":"), default=str)


def configure(level: str = "info") -> None:
    """Send the service's logs to stderr as JSON lines, from `level` up (idempotent: a second
    call changes nothing)."""
    if any(isinstance(h.formatter, JsonFormatter) for h in LOGGER.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level.upper())
    LOGGER.propagate = False


def log(level: int, event: str, **fields: Any) -> None:
    LOGGER.log(level, event, extra={"fields": fields})
