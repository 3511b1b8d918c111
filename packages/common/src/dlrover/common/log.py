"""Logging set-up: readable lines by default, JSON lines on request.

Only the `dlrover` logger is configured, never the root logger, so a training script's own
logging is left as its author set it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import IO, Any

from dlrover.common.errors import ConfigError

__all__ = ["JsonLinesFormatter", "LOG_FORMAT_ENV_VAR", "LOG_LEVEL_ENV_VAR", "configure_logging"]

LOG_FORMAT_ENV_VAR = "DLROVER_LOG_FORMAT"
LOG_LEVEL_ENV_VAR = "DLROVER_LOG_LEVEL"
_HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}
_HANDLER_MARK = "_dlrover_handler"


class JsonLinesFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(
    level: str | int | None = None,
    *,
    json_lines: bool | None = None,
    stream: IO[str] | None = None,
    logger_name: str = "dlrover",
) -> logging.Handler:
    """Send DLRover's logs to `stream` (stderr by default).

    Calling it again replaces the handler it installed before, so it is safe to call from every
    entry point.

    Args:
        level: a level name or number; `DLROVER_LOG_LEVEL` or INFO when None.
        json_lines: JSON lines instead of readable text; `DLROVER_LOG_FORMAT=json` when None.
        stream: where to write.
        logger_name: the logger to configure.

    Returns:
        The installed handler.

    Raises:
        ConfigError: an unknown level name or log format.
    """
    chosen_level = level if level is not None else os.environ.get(LOG_LEVEL_ENV_VAR, "INFO")
    if isinstance(chosen_level, str):
        number = logging.getLevelName(chosen_level.upper())
        if not isinstance(number, int):
            raise ConfigError(f"unknown log level {chosen_level!r}")
        chosen_level = number
    if json_lines is None:
        fmt = os.environ.get(LOG_FORMAT_ENV_VAR, "text").lower()
        if fmt not in ("text", "json"):
            raise ConfigError(f"{LOG_FORMAT_ENV_VAR} must be 'text' or 'json', got {fmt!r}")
        json_lines = fmt == "json"
    logger = logging.getLogger(logger_name)
    for old in [h for h in logger.handlers if getattr(h, _HANDLER_MARK, False)]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if json_lines else logging.Formatter(_HUMAN_FORMAT))
    setattr(handler, _HANDLER_MARK, True)
    logger.addHandler(handler)
    logger.setLevel(chosen_level)
    logger.propagate = False
    return handler
