"""Logging set-up for Tranche's commands: structured key=value or JSON lines.

Modules log with ``logging.getLogger(__name__)`` and pass context through
``extra={...}``; only entry points call :func:`configure`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Attributes every LogRecord has; anything else came from ``extra=`` and is context.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n'):
        return json.dumps(text)
    return text


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=info logger=... msg="..." key=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_quote(record.getMessage())}",
        ]
        parts += [f"{k}={_quote(v)}" for k, v in sorted(_context(record).items())]
        if record.exc_info:
            parts.append(f"error={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        body.update({k: v for k, v in _context(record).items()})
        if record.exc_info:
            body["error"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def configure(fmt: str = "text", level: str = "INFO") -> None:
    """Send every log record to stderr in ``fmt`` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
