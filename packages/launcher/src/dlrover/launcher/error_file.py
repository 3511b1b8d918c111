"""The error file of torch.distributed.elastic's ``@record``: where a worker writes why it failed.

torchrun gives every worker a path in ``TORCHELASTIC_ERROR_FILE``; a training function decorated
with `torch.distributed.elastic.multiprocessing.errors.record` writes its uncaught exception there
as JSON (``{"message": {"message": "<Type>: <text>", "extraInfo": {"py_callstack": ...}}}``).
`dlrover-run` does the same, and puts what the file says into the failure's evidence, so the
master's diagnosis sees the exception even when the worker's stderr scrolled past it. The file is
read as JSON and bounded in size: it is data from the worker, never code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["ERROR_FILE_ENV_VAR", "read_error_file"]

ERROR_FILE_ENV_VAR = "TORCHELASTIC_ERROR_FILE"

_LIMIT_BYTES = 256 * 1024
_MESSAGE_CHARS = 4 * 1024
_CALLSTACK_CHARS = 8 * 1024


def read_error_file(path: Path, limit_bytes: int = _LIMIT_BYTES) -> str:
    """What a worker's ``@record`` wrote to `path`, as text for a failure report.

    Returns:
        ``"<message>"`` (its first 4 KiB) plus the last 8 KiB of the Python call stack when it
        wrote one, so that it never crowds out the stderr tail of the evidence; "" when there
        is no file (the worker did not use ``@record``, or did not fail through it); a note
        saying why when the file is unreadable, too large or not torch's format.
    """
    try:
        with path.open("rb") as f:
            raw = f.read(limit_bytes + 1)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"(its error file {path} could not be read: {exc})"
    if len(raw) > limit_bytes:
        return f"(its error file {path} is over {limit_bytes} bytes; not read)"
    try:
        doc = json.loads(raw.decode("utf-8", "replace"))
        message: Any = doc["message"]
        if isinstance(message, str):  # an error file written by hand, not by @record
            return message[:_MESSAGE_CHARS]
        text = str(message["message"])[:_MESSAGE_CHARS]
        callstack = message.get("extraInfo", {}).get("py_callstack", "")
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the parser goes. Whatever the file holds, the
        # agent goes on: it is only evidence.
        return f"(its error file {path} is not torch's error file format: {type(exc).__name__})"
    if callstack:
        text += "\n" + str(callstack)[-_CALLSTACK_CHARS:]
    return text
