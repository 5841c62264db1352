"""Phrase output vectors computed ahead of time and read from disk (the CoG way: a phrase table beside the index).

A request's phrases come from documents that earlier requests, or an index build, have already
cut. :class:`PhraseVectorStore` holds the output vectors of such phrases, keyed by their token
ids, in shards on disk that are memory-mapped, so memory holds only a 16-byte key per phrase and
the vectors a request touches. A store is tied to one phrase encoder and its dtypes by
:func:`encoder_fingerprint`; the model reads it only while its encoder still has that fingerprint
(``DynamicVocabLM.use_phrase_store``).

Layout of a store folder::

    store.json          format, encoder fingerprint, dtypes, dim and what the builder recorded
    shard-00000/        one shard, written atomically (``dynvocab.io.atomic``)
        token_ids.npy   (sum of lengths,) int32: every phrase's token ids, one after the other
        offsets.npy     (n + 1,) int64: phrase i is token_ids[offsets[i]:offsets[i + 1]]
        vectors.npy     (n, d) float32, float16, or bfloat16 bits as uint16

The folder's parts (``store.json`` with a :class:`StoreKind`'s format tag, sequences of token ids in shards written
atomically, a build that resumes at its first unfinished shard) serve ``dynvocab.states.store`` too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..io.atomic import MANIFEST, atomic_directory, recover, remove_directory
from ..io.fingerprints import weights_digest

__all__ = ["PHRASE_VECTORS", "PhraseVectorStore", "StoreKind", "encoder_fingerprint", "phrase_keys", "read_record",
           "start_or_resume", "write_record", "write_shard", "write_token_shard"]

STORE_FILE = "store.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class StoreKind:
    """A kind of store folder: its ``format`` tag, what it holds (for messages) and the command that builds it."""

    format: str
    what: str
    command: str


PHRASE_VECTORS = StoreKind("dynvocab.PhraseVectorStore", "phrase vectors",
                           "dynvocab phrase-vectors --index <index folder>")
#: numpy dtypes the vectors are saved in, by ``phrase_dtype`` (numpy has no bfloat16: its bits are kept as uint16)
_SAVED = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
# odd 64-bit multipliers of the polynomial key (any fixed pair works; collisions are caught by comparing ids)
_BASE, _LENGTH = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


def encoder_fingerprint(encoder: torch.nn.Module, encode_dtype: str, phrase_dtype: str) -> str:
    """sha256 of a phrase encoder's weights (shared token embeddings included) and the dtypes it encodes in."""
    return weights_digest(encoder, f"{encode_dtype}/{phrase_dtype}")


def phrase_keys(flat_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``(n,)`` uint64 keys of the phrases ``flat_ids[offsets[i]:offsets[i + 1]]`` (one token or more each): a polynomial
    hash of their ids and length."""
    lengths = np.diff(offsets).astype(np.uint64)
    if not len(lengths):
        return np.zeros(0, dtype=np.uint64)
    starts = np.repeat(offsets[:-1], np.diff(offsets))
    position = (np.arange(len(flat_ids)) - starts).astype(np.uint64)
    with np.errstate(over="ignore"):  # wrapping multiplication is the hash
        terms = (flat_ids.astype(np.uint64) + np.uint64(1)) * _power(position)
        return np.add.reduceat(terms, offsets[:-1]) + lengths * _LENGTH


def _power(position: np.ndarray) -> np.ndarray:
    """``_BASE ** position`` modulo 2**64, elementwise (positions are phrase lengths: a few dozen at most)."""
    table = np.ones(int(position.max()) + 1 if len(position) else 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(1, len(table)):
            table[i] = table[i - 1] * _BASE
    return table[position]


def flatten(token_ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``(flat int32 ids, (n + 1,) int64 offsets)`` of a list of token-id phrases."""
    lengths = np.fromiter((len(ids) for ids in token_ids), dtype=np.int64, count=len(token_ids))
    offsets = np.zeros(len(token_ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((i for ids in token_ids for i in ids), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


def write_record(directory: str | Path, record: dict[str, Any], kind: StoreKind) -> None:
    """Write ``store.json`` (``kind``'s format tag, then ``record``) into ``directory``, atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path, staging = directory / STORE_FILE, directory / f".{STORE_FILE}.tmp"
    staging.write_text(json.dumps({"format": kind.format, "format_version": FORMAT_VERSION, **record}, indent=2) + "\n")
    staging.replace(path)


def start_or_resume(directory: Path, record: dict[str, Any], overwrite: bool, kind: StoreKind) -> None:
    """Write ``store.json``, or check that the one there describes the same build (else refuse, or with
    ``overwrite`` start again)."""
    if (directory / STORE_FILE).is_file():
        found = read_record(directory, kind)
        changed = sorted(name for name in record if found.get(name) != record[name])
        if not changed:
            return
        if not overwrite:
            raise ValueError(
                f"{directory} holds {kind.what} of another build (different {', '.join(changed)}); "
                "pass --overwrite (overwrite=True) to replace them"
            )
        remove_directory(directory)
    elif directory.is_dir() and any(directory.iterdir()):
        raise ValueError(f"refusing to write {kind.what} into {directory}: it is a non-empty folder with no "
                         f"{STORE_FILE}; pass another folder")
    write_record(directory, record, kind)


def write_shard(directory: str | Path, number: int, token_ids: Sequence[Sequence[int]], vectors: torch.Tensor) -> Path:
    """Write shard ``number`` (phrases ``token_ids`` and their ``(n, d)`` output ``vectors``) atomically."""
    if len(token_ids) != vectors.shape[0]:
        raise ValueError(f"{len(token_ids)} phrases but {vectors.shape[0]} vectors; pass one vector per phrase")
    vectors = vectors.detach().cpu().contiguous()
    saved = vectors.view(torch.uint16) if vectors.dtype == torch.bfloat16 else vectors
    return write_token_shard(directory, number, token_ids, {"vectors.npy": saved.numpy()})


def write_token_shard(directory: str | Path, number: int, token_ids: Sequence[Sequence[int]],
                      arrays: dict[str, np.ndarray]) -> Path:
    """Write shard ``number`` atomically: the sequences ``token_ids`` (``token_ids.npy``, ``offsets.npy``) and
    ``arrays`` (file name -> array) beside them."""
    flat, offsets = flatten(token_ids)
    target = shard_path(directory, number)
    with atomic_directory(target) as staging:
        np.save(staging / "token_ids.npy", flat)
        np.save(staging / "offsets.npy", offsets)
        for name, array in arrays.items():
            np.save(staging / name, array)
    return target


def shard_path(directory: str | Path, number: int) -> Path:
    return Path(directory) / f"shard-{number:05d}"


def finished_shards(directory: str | Path) -> list[int]:
    """Numbers of the shards whose atomic save completed, in order."""
    numbers = []
    for path in sorted(Path(directory).glob("shard-[0-9][0-9][0-9][0-9][0-9]")):
        recover(path)
        if (path / MANIFEST).is_file():
            numbers.append(int(path.name.removeprefix("shard-")))
    return numbers


def read_record(directory: str | Path, kind: StoreKind = PHRASE_VECTORS) -> dict[str, Any]:
    """``store.json`` of a ``kind`` store folder; ``ValueError`` naming the fix when it is missing or foreign."""
    path = Path(directory) / STORE_FILE
    if not path.is_file():
        raise ValueError(f"{directory} holds no {STORE_FILE}: it is not a store of {kind.what}; build one with "
                         f"`{kind.command}`")
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("format") != kind.format or record.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a version-{FORMAT_VERSION} {kind.format}; rebuild it with "
                         f"`{kind.command} --overwrite`")
    return record


class PhraseVectorStore:
    """Output vectors of phrases by token ids, read from a store folder's memory-mapped shards.

    ``lookup`` finds a request's phrases with one vectorised search over sorted 64-bit keys and
    checks their ids, so a key collision is a miss, never a wrong vector.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.record = read_record(self.directory)
        self.fingerprint: str = self.record["fingerprint"]
        self.phrase_dtype: str = self.record["phrase_dtype"]
        self.dim: int = int(self.record["dim"])
        ids, offsets, self._vectors = [], [np.zeros(1, dtype=np.int64)], []
        for number in finished_shards(self.directory):
            path = shard_path(self.directory, number)
            flat, starts = np.load(path / "token_ids.npy"), np.load(path / "offsets.npy")
            vectors = np.load(path / "vectors.npy", mmap_mode="r")
            if vectors.shape != (len(starts) - 1, self.dim):
                raise ValueError(f"{path}/vectors.npy has shape {vectors.shape}, not ({len(starts) - 1}, {self.dim}); "
                                 f"rebuild the store with `{PHRASE_VECTORS.command} --overwrite`")
            ids.append(flat)
            offsets.append(starts[1:] + offsets[-1][-1])
            self._vectors.append(vectors)
        #: every stored phrase's ids, one after the other, shard after shard; phrase g is flat[offsets[g]:offsets[g + 1]]
        self._flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
        self._offsets = np.concatenate(offsets)
        #: phrase g's vector is row g - shard_starts[s] of shard s
        self._shard_starts = np.cumsum([0] + [len(v) for v in self._vectors])
        keys = phrase_keys(self._flat, self._offsets)
        self._order = np.argsort(keys, kind="stable")
        self._keys = keys[self._order]
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def hit_rate(self) -> float:
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else 0.0

    @property
    def resident_bytes(self) -> int:
        """Bytes held in memory (keys, their order, token ids, offsets); the vectors stay on disk, paged in as read."""
        return sum(a.nbytes for a in (self._keys, self._order, self._flat, self._offsets, self._shard_starts))

    @property
    def disk_bytes(self) -> int:
        return sum(v.nbytes for v in self._vectors)

    def lookup(self, token_ids: Sequence[tuple[int, ...]]) -> tuple[list[int], torch.Tensor]:
        """``(positions found, their vectors (len(found), d))`` for the phrases ``token_ids`` (each of 1+ tokens)."""
        found = np.zeros(0, dtype=np.int64)
        if len(self._keys) and token_ids:
            flat, offsets = flatten(token_ids)
            keys = phrase_keys(flat, offsets)
            slots = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
            found = np.flatnonzero(self._keys[slots] == keys)
            stored = self._order[slots[found]]
            found, stored = self._same_ids(flat, offsets, found, stored)
        self.hits += len(found)
        self.misses += len(token_ids) - len(found)
        return found.tolist(), self._gather(stored if len(found) else np.zeros(0, dtype=np.int64))

    def _same_ids(self, flat: np.ndarray, offsets: np.ndarray, found: np.ndarray,
                  stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``(query positions, stored phrases)`` pairs whose token ids are equal, not only their keys."""
        lengths = offsets[found + 1] - offsets[found]
        same = lengths == self._offsets[stored + 1] - self._offsets[stored]
        found, stored, lengths = found[same], stored[same], lengths[same]
        if not len(found):
            return found, stored
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        equal = flat[np.repeat(offsets[found], lengths) + within] == self._flat[np.repeat(self._offsets[stored], lengths) + within]
        same = np.logical_and.reduceat(equal, np.cumsum(lengths) - lengths)
        return found[same], stored[same]

    def _gather(self, phrases: np.ndarray) -> torch.Tensor:
        """The vectors of stored phrases ``phrases``, ``(n, d)`` in ``phrase_dtype``, read shard by shard."""
        out = np.empty((len(phrases), self.dim), dtype=_SAVED[self.phrase_dtype])
        shards = np.searchsorted(self._shard_starts, phrases, side="right") - 1
        for shard in np.unique(shards).tolist():
            places = np.flatnonzero(shards == shard)
            rows = phrases[places] - self._shard_starts[shard]
            order = np.argsort(rows)  # ascending rows read the memory map front to back
            out[places[order]] = self._vectors[shard][rows[order]]
        tensor = torch.from_numpy(out)
        return tensor.view(torch.bfloat16) if self.phrase_dtype == "bfloat16" else tensor

    def stats(self) -> dict[str, float]:
        """Phrases held, hits, misses, hit rate, and the bytes in memory and on disk."""
        return {"phrases": len(self), "hits": self.hits, "misses": self.misses, "hit_rate": self.hit_rate,
                "resident_bytes": self.resident_bytes, "disk_bytes": self.disk_bytes}
