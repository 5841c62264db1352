"""Forward maximum matching: token ids -> a mix of tokens and phrases."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["forward_max_match"]


def forward_max_match(
    token_ids: Sequence[int],
    lookup: Callable[[tuple[int, ...]], int | None],
    max_phrase_tokens: int,
    boundaries: Sequence[bool] | None = None,
) -> list[tuple[int, int, int | None]]:
    """Segment ``token_ids`` greedily from the left, taking the longest phrase at each position.

    ``lookup(ids)`` returns a phrase's index for a run of token ids, or None. With
    ``boundaries`` (``len(token_ids) + 1`` flags), a phrase may only start and end where
    the flag is true, e.g. on word boundaries. Returns ``(start, end, phrase_index)``
    spans covering the input; ``phrase_index`` is None for a plain token (``end == start + 1``).
    """
    spans = []
    start, n = 0, len(token_ids)
    while start < n:
        match = None
        lengths = range(min(max_phrase_tokens, n - start), 1, -1)
        if boundaries is not None:
            lengths = [length for length in lengths if boundaries[start] and boundaries[start + length]]
        for length in lengths:
            index = lookup(tuple(token_ids[start : start + length]))
            if index is not None:
                match = (start, start + length, index)
                break
        spans.append(match or (start, start + 1, None))
        start = match[1] if match else start + 1
    return spans
