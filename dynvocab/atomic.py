"""Write a directory so that a failure never leaves a half-written one in place of a good one.

The one directory swap of the library: checkpoints, the MWT baseline and document
indexes are all written through :func:`atomic_directory`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_directory"]


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``path``; on success it replaces ``path``.

    Every file written into it is flushed to disk (fsync) before the swap. If the body
    raises, the temporary directory is removed and ``path`` is untouched; if the swap
    itself fails, the previous ``path`` is put back. Files already in ``path`` that the
    body does not write are not kept.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a directory; choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield staging
        _fsync_tree(staging)
        _swap_in(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync(path.parent)


def _swap_in(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``; a ``target`` already there is set aside first and put back on failure."""
    if not target.exists():
        os.replace(staging, target)
        return
    retired = target.with_name(f".{target.name}.old-{staging.name}")
    os.replace(target, retired)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(retired, target)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            _fsync(Path(folder) / name)
        _fsync(Path(folder))


def _fsync(path: Path) -> None:
    """Flush a file or a directory entry to disk (directories cannot be opened for this on Windows)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
