"""Turn a training checkpoint into an export folder that ``load_dynamic_lm`` reads, without its resume state.

A checkpoint is the export plus ``state/`` (optimizer, RNG, scheduler) and ``trainer_state.json``. This copies the
export's files after checking each against the checkpoint's manifest, so a checkpoint brought back without its
``state/`` (the GPU runs of #32 returned only the weights, under the device's file-size limit) still loads verified:

    python experiments/export_checkpoint.py runs/gpu-grid/d1/checkpoint-1750 runs/gpu-grid/d1/export-1750
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from dynvocab.io.atomic import MANIFEST, atomic_directory, file_sha256, read_manifest

RESUME_ONLY = ("state/", "trainer_state.json")


def export_checkpoint(checkpoint: Path, target: Path) -> list[str]:
    """Copy the export files of ``checkpoint`` into ``target`` (atomic, with a new manifest); the names copied."""
    recorded = read_manifest(checkpoint)
    names = sorted(name for name in recorded if not name.startswith(RESUME_ONLY))
    for name in names:
        path, record = checkpoint / name, recorded[name]
        if not path.is_file() or path.stat().st_size != record["bytes"] or file_sha256(path) != record["sha256"]:
            raise ValueError(f"{path} is missing or does not match {MANIFEST}; copy the checkpoint again")
    with atomic_directory(target) as staging:
        for name in names:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(checkpoint / name, staging / name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args()
    print(export_checkpoint(args.checkpoint, args.target))


if __name__ == "__main__":
    main()
