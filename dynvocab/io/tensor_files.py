"""Folders of safetensors files plus one JSON manifest: written atomically, hashed, checked on load.

The shortlist head and the retrieval models save through here: every tensor file's sha256
is recorded in the manifest and checked on load (the error names the file), and a tensor
holding NaN or Inf is refused on the way in and on the way out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .atomic import atomic_directory, file_sha256, recover

__all__ = ["MANIFEST", "read_tensor_folder", "write_tensor_folder"]

MANIFEST = "manifest.json"


def _check_finite(name: str, tensors: dict[str, torch.Tensor], where: str) -> None:
    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{where}: tensor {name}/{key} holds NaN or Inf; refit or retrain before saving")


def write_tensor_folder(
    directory: str | Path, kind: str, files: dict[str, dict[str, torch.Tensor]], metadata: dict[str, Any],
    extra_files: dict[str, str] | None = None, write: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``files`` (file name -> tensors) and a manifest (``kind``, hashes, ``metadata``) into ``directory``.

    The folder is replaced atomically (``dynvocab.io.atomic``); a non-empty folder without a
    manifest is refused rather than replaced. ``extra_files`` are text files (name -> content);
    ``write(staging)`` may add any other files (a Hugging Face ``save_pretrained``). Every file
    written is hashed.
    """
    target = Path(directory)
    if target.is_dir() and any(target.iterdir()) and not (target / MANIFEST).exists():
        raise ValueError(
            f"refusing to overwrite {str(target)!r}: it is a non-empty folder this library did not write; "
            "pass a new or empty folder"
        )
    for name, tensors in files.items():
        _check_finite(name, tensors, f"cannot save to {target}")
    with atomic_directory(target) as staging:
        for name, tensors in files.items():
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, staging / name)
        for name, content in (extra_files or {}).items():
            (staging / name).write_text(content, encoding="utf-8")
        if write is not None:
            write(staging)
        hashes = {p.relative_to(staging).as_posix(): file_sha256(p) for p in sorted(staging.rglob("*")) if p.is_file()}
        manifest = {"format": kind, "sha256": hashes, **metadata}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return target


def read_tensor_folder(directory: str | Path, kind: str) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
    """The manifest and every tensor file of a folder written by ``write_tensor_folder`` with this ``kind``."""
    directory = Path(directory)
    recover(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no {kind} at {str(directory)!r} ({MANIFEST} is missing); save one there first")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is truncated or corrupted ({error}); save the {kind} again") from error
    if not isinstance(manifest, dict) or manifest.get("format") != kind:
        raise ValueError(f"{path} does not describe a {kind} (format {manifest.get('format')!r}); load it with its own class")
    tensors = {}
    for name, expected in manifest["sha256"].items():
        file = directory / name
        if not file.is_file():
            raise ValueError(f"{file} is missing; save the {kind} again")
        if file_sha256(file) != expected:
            raise ValueError(f"{file} is corrupted: its sha256 does not match {MANIFEST}; save the {kind} again")
        if name.endswith(".safetensors") and "/" not in name:
            tensors[name] = load_file(file)
            _check_finite(name, tensors[name], f"cannot load {file}")
    return manifest, tensors
