"""Structured logs: one JSON object per line, with the fields a record carries in ``extra`` (a request id...)."""

from __future__ import annotations

import json
import logging

#: attributes every ``LogRecord`` has; anything else on a record came through ``extra``
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", **extra}`` as one JSON line (the command line installs it)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        entry |= {key: value for key, value in vars(record).items() if key not in _STANDARD}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
