"""Structured logs: one JSON object per line, fields given explicitly, never object contents."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

LOGGER = logging.getLogger("gpuclass_hooks")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        return json.dumps(line, separators=(",", ":"), default=str)


def configure(level: str = "INFO") -> None:
    """Send the service's logs to stderr as JSON lines (idempotent)."""
    if any(isinstance(h.formatter, JsonFormatter) for h in LOGGER.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
    LOGGER.propagate = False


def log(level: int, event: str, **fields: Any) -> None:
    LOGGER.log(level, event, extra={"fields": fields})
