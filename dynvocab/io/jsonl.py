"""One reader for JSON-lines files: one value a line, errors that name the file and the line."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["iter_jsonl"]

logger = logging.getLogger(__name__)


def iter_jsonl(
    path: str | os.PathLike, fix: str = "fix or remove that line", drop_cut_last_line: bool = False
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, value)`` for each non-blank line of ``path``, one line at a time.

    A line that is not JSON raises ``ValueError`` naming ``path:line``, the JSON error and
    ``fix``. With ``drop_cut_last_line`` a last line that is not JSON (cut short by a
    writer that was killed) is logged and removed from the file instead: the file then
    ends after the last whole line, ready to be appended to.
    """
    path = Path(path)
    offset, cut = 0, None
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                if drop_cut_last_line and not raw.endswith(b"\n"):  # a writer ends every record with a newline
                    raise ValueError("the line has no newline: its writer was stopped mid-record")
                value = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
                if drop_cut_last_line and not handle.readline():
                    cut = start
                    break
                reason = getattr(error, "msg", None) or str(error)
                raise ValueError(f"{path}:{number} is not valid JSON ({reason}); {fix}") from error
            yield number, value
    if cut is not None:
        logger.warning("%s: dropping a last line cut short by an interrupted run", path)
        os.truncate(path, cut)
