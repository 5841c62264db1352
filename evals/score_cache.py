"""Quality figures kept beside the generations, so that resuming a report scores only what changed.

Scoring a system (MAUVE features and perplexity under the scorer LM) costs minutes on a
CPU, and a report resumed to add one system used to score every system again. Each
entry of ``scores.jsonl`` holds the figures computed from one exact input: the texts,
prompts, references and step counts scored, the scorer LM, the featurizer, the MAUVE
seeds and the library's version, hashed together. Any change to one of them is a new
key; a change to the metrics' own code within one version is not, so delete the file
after one to force a rescore.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from dynvocab.io.jsonl import iter_jsonl

__all__ = ["ScoreCache", "score_key"]

FILENAME = "scores.jsonl"


def _library_version() -> str:
    try:
        return version("dynvocab")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "source"


def score_key(kind: str, settings: dict, items: list) -> str:
    """sha256 of what a figure depends on: its ``kind``, the scorer ``settings`` and the scored ``items``."""
    payload = {"kind": kind, "settings": settings, "version": _library_version(), "items": items}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


class ScoreCache:
    """Figures by key, read from and appended to ``<directory>/scores.jsonl`` (one ``{"key", "figures"}`` a line)."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / FILENAME
        self.entries: dict[str, dict] = {}
        self.hits = 0
        if self.path.exists():
            for _, entry in iter_jsonl(self.path, fix=f"or delete {self.path} to rescore", drop_cut_last_line=True):
                if not isinstance(entry, dict) or not isinstance(entry.get("figures"), dict) or "key" not in entry:
                    raise ValueError(f"{self.path} holds a line that is not a score entry; delete the file to rescore")
                self.entries[entry["key"]] = entry["figures"]

    def get_or_compute(self, key: str, compute: Callable[[], dict]) -> dict:
        """The figures stored under ``key``, or ``compute()``'s, appended to the file before they are returned."""
        if key in self.entries:
            self.hits += 1
            return self.entries[key]
        figures = compute()
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"key": key, "figures": figures}, ensure_ascii=False) + "\n")
        self.entries[key] = figures
        return figures
