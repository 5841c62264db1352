"""Write a directory so that no crash, kill or full disk ever loses the last good copy.

The one directory swap of the library: model saves, trainer checkpoints, the MWT
baseline and document indexes are all written through :func:`atomic_directory`.

A save is built in a hidden sibling folder, gets a manifest of the files it wrote
(their sizes and sha256) as its very last file, and is then renamed into place. The
manifest is the completion marker: a folder without one is not a finished save. A
kill between the two renames of the swap leaves the path empty for a moment; the next
:func:`recover` (every loader calls it) puts the newest complete copy back. Files in the
target that the library did not write are carried into the new copy, never deleted.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["MANIFEST", "atomic_directory", "file_sha256", "read_manifest", "recover", "remove_directory", "verify"]

logger = logging.getLogger(__name__)

#: written last into every saved folder: ``{"format": ..., "files": {relative path: {"bytes", "sha256"}}}``
MANIFEST = "dynvocab_manifest.json"
_FORMAT = "dynvocab.manifest"
#: hidden siblings of a folder being saved: ``.<name>.dynvocab-staging-*`` (the new copy) and ``...-retired-*`` (the old)
_STAGING, _RETIRED, _DELETING = ".dynvocab-staging-", ".dynvocab-retired-", ".dynvocab-deleting-"


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a fresh staging folder beside ``path``; on success it replaces ``path`` atomically.

    If the body raises, ``path`` is untouched. Files already in ``path`` that an earlier
    save did not list in its manifest (the user's own) are carried over by hard link; if
    the body wrote a file of the same name, ``ValueError`` is raised and nothing changes.
    """
    path = Path(os.path.abspath(path))  # "." or "..": a folder with a name, which the swap can rename
    inside = Path(os.path.abspath(os.curdir)) == path
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a directory; choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}{_STAGING}", dir=path.parent))
    try:
        yield staging
        written = _relative_files(staging)
        _carry_foreign(path, staging)
        _write_manifest(staging, written)
        _fsync_tree(staging)
        _swap_in(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if inside:  # the process stood in the folder that was swapped out: stand in the new copy
        os.chdir(path)
    _fsync(path.parent)


def recover(path: str | Path) -> None:
    """Finish or undo a save that was killed: afterwards ``path`` holds the newest complete copy, if any exists.

    When ``path`` is missing (a kill between the two renames of a swap), a complete staging
    copy (it has its manifest) or else the set-aside previous copy is renamed back. Hidden
    leftovers of interrupted saves of ``path`` are then removed: the library wrote them.
    """
    path = Path(path)
    name = glob.escape(path.name)
    staged = sorted(path.parent.glob(f".{name}{_STAGING}*"), key=_mtime, reverse=True)
    retired = sorted(path.parent.glob(f".{name}{_RETIRED}*"), key=_mtime, reverse=True)
    if not path.exists():
        complete = [folder for folder in staged if (folder / MANIFEST).is_file()] + retired
        if complete:
            logger.warning("%s was missing after an interrupted save; restored it from %s", path, complete[0].name)
            os.replace(complete[0], path)
            _fsync(path.parent)
    deleting = list(path.parent.glob(f".{name}{_DELETING}*"))
    for leftover in staged + retired + deleting:
        if leftover.exists():
            shutil.rmtree(leftover, ignore_errors=True)


def remove_directory(path: str | Path) -> None:
    """Delete a saved folder so that a kill part-way never leaves half of it at ``path``: renamed away first."""
    path = Path(path)
    doomed = path.with_name(f".{path.name}{_DELETING}{os.getpid()}")
    os.replace(path, doomed)
    _fsync(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def read_manifest(directory: str | Path) -> dict[str, dict]:
    """The ``{relative path: {"bytes", "sha256"}}`` a save recorded; ``ValueError`` if the folder has no manifest."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ValueError(
            f"{directory} has no {MANIFEST}: it is not a complete dynvocab save (the save was interrupted, or the "
            "folder was written by something else); save it again, or point to a folder a dynvocab save wrote"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is corrupted ({error}); save the folder again") from error
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{path} is not a dynvocab manifest; save the folder again")
    return manifest["files"]


def verify(directory: str | Path) -> None:
    """Check every file the manifest lists against its recorded size and sha256; ``ValueError`` names the first bad one."""
    directory = Path(directory)
    for name, record in read_manifest(directory).items():
        path = directory / name
        fix = ("the file was edited, truncated or corrupted after it was saved; restore it or save the folder again "
               "(an edit made on purpose, e.g. to a config: load with verify=False)")
        if not path.is_file():
            raise ValueError(f"{path} is missing though {MANIFEST} lists it; {fix}")
        if path.stat().st_size != record["bytes"] or file_sha256(path) != record["sha256"]:
            raise ValueError(f"{path} does not match the size and sha256 recorded when it was saved: {fix}")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _relative_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _library_names(directory: Path) -> set[str]:
    """Top-level names an earlier save wrote into ``directory`` (empty when it holds no manifest)."""
    try:
        files = read_manifest(directory)
    except ValueError:
        return set()
    return {Path(name).parts[0] for name in files} | {MANIFEST}


def _carry_foreign(target: Path, staging: Path) -> None:
    """Hard-link into ``staging`` every entry of ``target`` that no dynvocab save wrote; refuse a name clash."""
    if not target.is_dir():
        return
    ours = _library_names(target)
    for entry in sorted(target.iterdir()):
        if entry.name in ours:
            continue
        destination = staging / entry.name
        if destination.exists() or destination.is_symlink():
            raise ValueError(
                f"{entry} is not a file an earlier dynvocab save wrote, and this save would overwrite it; "
                f"move it away, or save to another folder"
            )
        if entry.is_symlink():
            os.symlink(os.readlink(entry), destination)
        elif entry.is_dir():
            shutil.copytree(entry, destination, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, destination)


def _link_or_copy(source: str | Path, destination: str | Path) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _write_manifest(staging: Path, written: list[str]) -> None:
    files = {name: {"bytes": (staging / name).stat().st_size, "sha256": file_sha256(staging / name)} for name in written}
    (staging / MANIFEST).write_text(json.dumps({"format": _FORMAT, "files": files}, indent=1) + "\n", encoding="utf-8")


def _swap_in(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``; a ``target`` already there is set aside first and put back on failure."""
    if not target.exists():
        os.replace(staging, target)
        return
    retired = target.with_name(f".{target.name}{_RETIRED}{staging.name.rsplit(_STAGING, 1)[-1]}")
    os.replace(target, retired)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(retired, target)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


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
