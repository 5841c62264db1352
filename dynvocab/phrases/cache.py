"""Phrase vectors kept across phrase sets: a phrase encoded for one request is free for the next.

``set_phrases`` makes the table exactly one request's phrases, so the vectors of phrases that
left it would be encoded again when a later request brings them back (documents are retrieved
again and again, and their phrases with them). :class:`PhraseVectorCache` keeps the output
vectors of the phrases encoded so far, keyed by their token ids, in least-recently-used order
under a byte budget. The model empties it when the phrase encoder's weights change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

__all__ = ["PhraseVectorCache"]


class PhraseVectorCache:
    """Output vectors by phrase token ids, least recently used dropped first once ``max_bytes`` is reached."""

    def __init__(self, max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes!r} must be an int >= 0 (0 turns the cache off)")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._vectors: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._vectors)

    @property
    def hit_rate(self) -> float:
        """Share of looked-up phrases found (0 before any look-up)."""
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else 0.0

    def split(self, token_ids: Sequence[tuple[int, ...]]) -> tuple[dict[int, torch.Tensor], list[int]]:
        """``({position: vector}, [positions to encode])`` for ``token_ids``; found ones become the most recent."""
        found, missing = {}, []
        for position, ids in enumerate(token_ids):
            vector = self._vectors.get(ids)
            if vector is None:
                missing.append(position)
            else:
                self._vectors.move_to_end(ids)
                found[position] = vector
        self.hits += len(found)
        self.misses += len(missing)
        return found, missing

    def put(self, token_ids: Sequence[tuple[int, ...]], vectors: torch.Tensor) -> None:
        """Keep ``vectors`` ``(n, d)`` of ``token_ids``, then drop the least recently used beyond ``max_bytes``."""
        if not self.max_bytes:
            return
        for ids, vector in zip(token_ids, vectors):
            vector = vector.detach().clone()  # a view would keep the whole batch alive
            previous = self._vectors.pop(ids, None)
            if previous is not None:
                self.bytes -= _size(previous)
            self._vectors[ids] = vector
            self.bytes += _size(vector)
        while self.bytes > self.max_bytes and self._vectors:
            _, dropped = self._vectors.popitem(last=False)
            self.bytes -= _size(dropped)

    def clear(self) -> None:
        """Forget every vector (the encoder changed); the hit counts stay."""
        self._vectors.clear()
        self.bytes = 0

    def stats(self) -> dict[str, float]:
        """Phrases kept, bytes used and allowed, hits, misses and the hit rate."""
        return {"phrases": len(self), "bytes": self.bytes, "max_bytes": self.max_bytes, "hits": self.hits,
                "misses": self.misses, "hit_rate": self.hit_rate}


def _size(vector: torch.Tensor) -> int:
    return vector.numel() * vector.element_size()
