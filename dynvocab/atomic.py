"""Write a directory so that a failure never leaves a half-written one in place of a good one."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``path``; on success it replaces ``path``.

    If the body raises, the temporary directory is removed and ``path`` is untouched.
    Files already in ``path`` that the body does not write are not kept.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a directory; choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    retired = None
    if path.exists():
        retired = path.with_name(f".{path.name}.old-{staging.name}")
        path.rename(retired)
    staging.rename(path)
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)
