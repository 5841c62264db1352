"""Repetition (Rep-n) and diversity of generated text, as reported by SimCTG and the dynamic-vocabulary paper.

Conventions (SimCTG's ``simctg/evaluation.py``, which the paper's numbers come from):

* A text is split into words by whitespace (``str.split``) unless a ``tokenizer``
  callable is passed; pre-tokenised sequences (lists of words or token ids) are used as is.
* Unique n-grams are counted **within each text**, then the counts are **pooled**
  over texts: ``Rep-n = 100 * (1 - sum_i unique_i / sum_i total_i)``. This is a
  micro-average, not a mean of per-text ratios (``average="per_text"`` gives the latter).
* ``Diversity = prod_{n=2..4} (1 - Rep-n / 100)``.

SimCTG's loop stops one window early and so never counts the last n-gram of a text;
``simctg_exact=True`` reproduces that to compare with published tables. The default
counts all ``len - n + 1`` n-grams.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

TextsOrTokens = Sequence[str] | Sequence[Sequence[Hashable]]
_AVERAGES = ("pooled", "per_text")


@dataclass(frozen=True)
class RepetitionResult:
    """Rep-2/3/4 in percent (0 = no repeated n-gram) and diversity in [0, 1] (1 = no repetition)."""

    rep2: float
    rep3: float
    rep4: float
    diversity: float


def _to_tokens(
    texts_or_token_lists: TextsOrTokens, tokenizer: Callable[[str], Sequence[Hashable]] | None
) -> list[Sequence[Hashable]]:
    if isinstance(texts_or_token_lists, str):
        raise TypeError(
            "texts_or_token_lists must be a sequence of texts or of token lists, got a single str; "
            "wrap it in a list: [text]"
        )
    split = tokenizer if tokenizer is not None else str.split
    bad = next((item for item in texts_or_token_lists if not isinstance(item, (str, list, tuple))), None)
    if bad is not None:
        raise TypeError(
            f"texts_or_token_lists must hold texts (str) or token lists, got a {type(bad).__name__} {bad!r}; "
            "pass e.g. ['the cat sat'] or [[464, 3797]]"
        )
    return [split(item) if isinstance(item, str) else list(item) for item in texts_or_token_lists]


def ngram_counts(tokens: Sequence[Hashable], n: int, simctg_exact: bool = False) -> tuple[int, int]:
    """``(unique, total)`` n-grams of one token sequence; ``total = max(0, len(tokens) - n + 1)``."""
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    stop = len(tokens) - n + (0 if simctg_exact else 1)
    grams = [tuple(tokens[i : i + n]) for i in range(max(0, stop))]
    return len(set(grams)), len(grams)


def rep_n(
    texts_or_token_lists: TextsOrTokens,
    n: int,
    *,
    tokenizer: Callable[[str], Sequence[Hashable]] | None = None,
    average: str = "pooled",
    simctg_exact: bool = False,
) -> float:
    """Rep-n in percent over a list of texts (or token lists); see the module docstring for the conventions.

    ``average="pooled"`` (SimCTG) sums unique and total counts over texts before dividing;
    ``average="per_text"`` averages the per-text Rep-n over texts that have at least one n-gram.
    Returns ``nan`` (and logs a warning) when no text has ``n`` tokens.
    """
    if average not in _AVERAGES:
        raise ValueError(f"average must be one of {_AVERAGES}, got {average!r}")
    counts = [ngram_counts(tokens, n, simctg_exact) for tokens in _to_tokens(texts_or_token_lists, tokenizer)]
    counts = [(unique, total) for unique, total in counts if total > 0]
    if not counts:
        logger.warning("rep_n: no text has enough tokens for a %d-gram; returning nan", n)
        return math.nan
    if average == "pooled":
        unique = sum(u for u, _ in counts)
        total = sum(t for _, t in counts)
        return 100.0 * (1.0 - unique / total)
    return 100.0 * sum(1.0 - u / t for u, t in counts) / len(counts)


def diversity(
    texts_or_token_lists: TextsOrTokens,
    *,
    tokenizer: Callable[[str], Sequence[Hashable]] | None = None,
    average: str = "pooled",
    simctg_exact: bool = False,
) -> RepetitionResult:
    """Rep-2, Rep-3, Rep-4 and their diversity ``prod_n (1 - Rep-n / 100)`` for a list of texts."""
    token_lists = _to_tokens(texts_or_token_lists, tokenizer)
    reps = [rep_n(token_lists, n, average=average, simctg_exact=simctg_exact) for n in (2, 3, 4)]
    div = math.prod(1.0 - rep / 100.0 for rep in reps)
    return RepetitionResult(rep2=reps[0], rep3=reps[1], rep4=reps[2], diversity=div)


def loops(text_or_tokens: str | Sequence[Hashable], n: int = 4, times: int = 3) -> bool:
    """Whether one text loops: some n-gram of its words occurs at least ``times`` times.

    A text's words are its runs of word characters, lowercased ("Earth," and "earth" match);
    a token list is used as is. The QA report's loop count: "is a planet's surface is a
    planet's surface is a planet's surface" loops at ``n=4, times=3``; an answer that names
    its subject twice does not.
    """
    if n < 1 or times < 2:
        raise ValueError(f"loops needs n >= 1 and times >= 2, got n={n!r}, times={times!r}")
    tokens = re.findall(r"\w+", text_or_tokens.lower()) if isinstance(text_or_tokens, str) else list(text_or_tokens)
    counts = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return any(count >= times for count in counts.values())
