"""Mixed training samples: token sequences in which some spans are emitted as one phrase token.

The paper builds its training data by picking spans of a text and treating each as a
single phrase. Three span samplers are provided, all sharing one spacing rule (at
least ``min_gap`` plain tokens between two phrases) and one density knob
(``phrase_prob``, the chance that an eligible position starts a phrase):

* :class:`NWordsSampler`: runs of 2-5 words (NLTK's word tokenizer), kept only when
  both ends fall on LM token boundaries;
* :class:`NIdsSampler`: runs of 2-5 LM tokens;
* :class:`FMMSampler`: forward maximum matching against a set of frequent n-grams
  (see :func:`dynvocab.tokens.ngrams.mine_ngrams`).

:func:`build_samples` streams texts through a tokenizer and a sampler.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "FMMSampler",
    "MixedSample",
    "NIdsSampler",
    "NWordsSampler",
    "SpanSampler",
    "build_samples",
    "chunk_bounds",
    "token_boundaries",
    "word_spans",
]

logger = logging.getLogger(__name__)

Offsets = Sequence[tuple[int, int]]
_FALLBACK_WORDS = re.compile(r"\w+|[^\w\s]+")


@dataclass
class MixedSample:
    """A text in LM tokens plus the token spans that each become one phrase.

    ``phrase_spans`` holds ``[start, end)`` token indices, sorted and non-overlapping;
    ``candidate_spans`` every span the sampler could have chosen (the ``same-text`` negatives).
    """

    token_ids: list[int]
    phrase_spans: list[tuple[int, int]] = field(default_factory=list)
    candidate_spans: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        previous_end = 0
        for start, end in self.phrase_spans:
            if not (previous_end <= start < end <= len(self.token_ids)):
                raise ValueError(
                    f"phrase_spans={self.phrase_spans} is invalid for {len(self.token_ids)} tokens: spans must be "
                    "sorted, non-overlapping, non-empty [start, end) ranges inside token_ids; fix the span list"
                )
            previous_end = end

    def phrases(self) -> list[tuple[int, ...]]:
        """The token ids of each phrase span, in span order."""
        return [tuple(self.token_ids[start:end]) for start, end in self.phrase_spans]


def _check_range(name_min: str, low: int, name_max: str, high: int) -> None:
    if not 2 <= low <= high:
        raise ValueError(
            f"{name_min}={low}, {name_max}={high}: need 2 <= {name_min} <= {name_max} "
            "(a 1-token phrase is already in the vocabulary); raise the values or swap them"
        )


class SpanSampler:
    """Base class: subclasses list candidate spans, this class applies spacing and density.

    Call as ``sampler(token_ids, text=..., offsets=..., rng=...)``; ``text`` and
    ``offsets`` (the fast tokenizer's character offsets of each token, relative to
    ``text``) are needed only when :attr:`needs_text` is true.
    """

    needs_text = False

    def __init__(self, min_gap: int = 5, phrase_prob: float = 0.5) -> None:
        if min_gap < 0:
            raise ValueError(f"min_gap={min_gap} must be >= 0 (plain tokens between two phrases); pass e.g. 5")
        if not 0.0 <= phrase_prob <= 1.0:
            raise ValueError(
                f"phrase_prob={phrase_prob} must lie in [0, 1] (chance that a free position starts a phrase)"
            )
        self.min_gap = min_gap
        self.phrase_prob = phrase_prob

    def candidates(self, token_ids: list[int], text: str | None, offsets: Offsets | None) -> dict[int, list[int]]:
        """Map a start token index to the exclusive end indices of spans allowed to start there."""
        raise NotImplementedError

    def __call__(
        self,
        token_ids: list[int],
        *,
        text: str | None = None,
        offsets: Offsets | None = None,
        rng: random.Random,
    ) -> MixedSample:
        """Choose phrase spans left to right, keeping ``min_gap`` plain tokens between two phrases."""
        if self.needs_text and (text is None or offsets is None or len(offsets) != len(token_ids)):
            raise ValueError(
                f"{type(self).__name__} needs text= and offsets= with one (start, end) pair per token "
                f"(got text={'None' if text is None else 'str'}, offsets of length "
                f"{None if offsets is None else len(offsets)} for {len(token_ids)} tokens); tokenize with "
                "return_offsets_mapping=True or use build_samples"
            )
        starts = self.candidates(token_ids, text, offsets)
        spans: list[tuple[int, int]] = []
        position = 0
        while position < len(token_ids):
            ends = starts.get(position)
            if ends and rng.random() < self.phrase_prob:
                end = self.pick_end(ends, rng)
                spans.append((position, end))
                position = end + self.min_gap
            else:
                position += 1
        candidates = [(start, end) for start, ends in starts.items() for end in ends]
        return MixedSample(list(token_ids), spans, candidates)

    def pick_end(self, ends: list[int], rng: random.Random) -> int:
        """Choose one of the allowed ends (uniformly; FMM overrides this to take the longest)."""
        return rng.choice(ends)


class NIdsSampler(SpanSampler):
    """Phrases are random runs of ``min_tokens``..``max_tokens`` LM tokens."""

    def __init__(self, min_tokens: int = 2, max_tokens: int = 5, min_gap: int = 5, phrase_prob: float = 0.5) -> None:
        super().__init__(min_gap, phrase_prob)
        _check_range("min_tokens", min_tokens, "max_tokens", max_tokens)
        self.min_tokens, self.max_tokens = min_tokens, max_tokens

    def candidates(self, token_ids: list[int], text: str | None, offsets: Offsets | None) -> dict[int, list[int]]:
        n = len(token_ids)
        return {
            start: list(range(start + self.min_tokens, min(start + self.max_tokens, n) + 1))
            for start in range(n - self.min_tokens + 1)
        }


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of NLTK's words (``NLTKWordTokenizer``, no data download needed).

    Falls back to a ``\\w+|[^\\w\\s]+`` regex on the rare text NLTK cannot align.
    """
    from nltk.tokenize import NLTKWordTokenizer

    try:
        return list(NLTKWordTokenizer().span_tokenize(text))
    except ValueError:
        logger.debug("NLTK could not align words of %r; using the regex fallback", text[:60])
        return [match.span() for match in _FALLBACK_WORDS.finditer(text)]


def token_boundaries(text: str, offsets: Offsets) -> tuple[dict[int, int], dict[int, int]]:
    """Character positions where a token run may start or end cleanly.

    Returns ``(start_at, end_at)``: ``start_at[c] = i`` when token ``i`` begins at
    character ``c`` (leading whitespace that byte-level BPE folds into a token is
    skipped) and no earlier token reaches past ``c``; ``end_at[c] = j`` when tokens
    ``< j`` end at ``c`` and token ``j`` starts at or after ``c``. Byte-level tokens
    that split one character share its offsets and so never yield a boundary inside it.
    """
    start_at: dict[int, int] = {}
    end_at: dict[int, int] = {}
    reach = 0
    for i, (start, end) in enumerate(offsets):
        if start == end:  # special tokens have no characters
            continue
        trimmed = start
        while trimmed < end and text[trimmed].isspace():
            trimmed += 1
        if trimmed < end and reach <= trimmed:
            start_at.setdefault(trimmed, i)
        following = offsets[i + 1] if i + 1 < len(offsets) else (end, end + 1)
        if following[0] >= end or following[0] == following[1]:
            end_at[end] = i + 1
        reach = max(reach, end)
    return start_at, end_at


class NWordsSampler(SpanSampler):
    """Phrases are random runs of ``min_words``..``max_words`` words whose ends fall on token boundaries."""

    needs_text = True

    def __init__(
        self,
        min_words: int = 2,
        max_words: int = 5,
        min_gap: int = 5,
        phrase_prob: float = 0.5,
        word_tokenizer: Callable[[str], list[tuple[int, int]]] = word_spans,
    ) -> None:
        super().__init__(min_gap, phrase_prob)
        _check_range("min_words", min_words, "max_words", max_words)
        self.min_words, self.max_words = min_words, max_words
        self.word_tokenizer = word_tokenizer

    def candidates(self, token_ids: list[int], text: str | None, offsets: Offsets | None) -> dict[int, list[int]]:
        assert text is not None and offsets is not None
        if not offsets:
            return {}
        spans = [(start, end) for start, end in offsets if start < end] or [(0, 0)]
        base = min(start for start, _ in spans)
        local = [(max(start - base, 0), max(end - base, 0)) for start, end in offsets]
        limit = max(end for _, end in spans)
        chunk = text[base:limit]
        start_at, end_at = token_boundaries(chunk, local)
        words = self.word_tokenizer(chunk)
        # a chunk cut from a longer text may begin or end inside a word: drop such partial words
        if words and words[0][0] == 0 and base > 0 and not text[base - 1].isspace():
            words = words[1:]
        if words and words[-1][1] == len(chunk) and limit < len(text) and not text[limit].isspace():
            words = words[:-1]
        found: dict[int, list[int]] = {}
        for k, (word_start, _) in enumerate(words):
            first = start_at.get(word_start)
            if first is None:
                continue
            for n in range(self.min_words, self.max_words + 1):
                if k + n > len(words):
                    break
                last = end_at.get(words[k + n - 1][1])
                if last is not None and last - first >= 2:
                    found.setdefault(first, []).append(last)
        return found


class FMMSampler(SpanSampler):
    """Forward maximum matching: at each free position take the longest phrase of ``phrase_set`` there.

    ``phrase_prob`` (default 1.0, i.e. plain FMM) can thin the matches out. Phrases
    shorter than 2 or longer than ``max_phrase_tokens`` tokens are ignored.
    """

    def __init__(
        self,
        phrase_set: Iterable[Sequence[int]],
        min_gap: int = 5,
        max_phrase_tokens: int = 8,
        phrase_prob: float = 1.0,
    ) -> None:
        super().__init__(min_gap, phrase_prob)
        if max_phrase_tokens < 2:
            raise ValueError(f"max_phrase_tokens={max_phrase_tokens} must be >= 2; pass e.g. 8")
        self.max_phrase_tokens = max_phrase_tokens
        self.phrase_set = {tuple(p) for p in phrase_set if 2 <= len(p) <= max_phrase_tokens}
        self._prefixes = {p[:k] for p in self.phrase_set for k in range(1, len(p))}
        if not self.phrase_set:
            logger.warning("FMMSampler got no phrase of 2..%d tokens; it will choose no span", max_phrase_tokens)

    def candidates(self, token_ids: list[int], text: str | None, offsets: Offsets | None) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        for start in range(len(token_ids) - 1):
            longest = 0
            for end in range(start + 2, min(start + self.max_phrase_tokens, len(token_ids)) + 1):
                piece = tuple(token_ids[start:end])
                if piece in self.phrase_set:
                    longest = end
                if piece not in self._prefixes:
                    break
            if longest:
                found[start] = [longest]
        return found

    def pick_end(self, ends: list[int], rng: random.Random) -> int:
        return max(ends)


def build_samples(
    texts: Iterable[str],
    tokenizer: PreTrainedTokenizerBase,
    sampler: SpanSampler,
    max_length: int,
    *,
    seed: int | random.Random = 0,
    min_length: int = 2,
    add_special_tokens: bool = False,
    batch_size: int = 64,
) -> Iterator[MixedSample]:
    """Stream :class:`MixedSample` objects: tokenize, cut into chunks of <= ``max_length`` tokens, sample spans.

    Arguments are checked at the call; ``texts`` is consumed lazily, ``batch_size`` texts at a time. Chunks shorter than
    ``min_length`` tokens are dropped. No special tokens are added unless
    ``add_special_tokens``; the collator adds BOS/EOS as its model needs. ``seed`` is
    an int or a ``random.Random`` (shared, so the caller can continue its stream).
    """
    if max_length < 1:
        raise ValueError(f"max_length={max_length} must be >= 1 tokens per chunk; pass e.g. 256")
    if sampler.needs_text and not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{type(sampler).__name__} needs character offsets, which only fast tokenizers give; "
            f"got {type(tokenizer).__name__}: load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )
    rng = seed if isinstance(seed, random.Random) else random.Random(seed)
    return _stream(texts, tokenizer, sampler, max_length, rng, min_length, add_special_tokens, batch_size)


def _stream(
    texts, tokenizer, sampler, max_length, rng, min_length, add_special_tokens, batch_size
) -> Iterator[MixedSample]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == batch_size:
            yield from _samples_of_batch(batch, tokenizer, sampler, max_length, rng, min_length, add_special_tokens)
            batch = []
    if batch:
        yield from _samples_of_batch(batch, tokenizer, sampler, max_length, rng, min_length, add_special_tokens)


def _samples_of_batch(
    texts: list[str],
    tokenizer,
    sampler: SpanSampler,
    max_length: int,
    rng: random.Random,
    min_length: int,
    add_special_tokens: bool,
) -> Iterator[MixedSample]:
    encoded = tokenizer(
        texts, add_special_tokens=add_special_tokens, return_offsets_mapping=sampler.needs_text, verbose=False
    )
    for index, text in enumerate(texts):
        ids = encoded["input_ids"][index]
        offsets = [tuple(o) for o in encoded["offset_mapping"][index]] if sampler.needs_text else None
        for begin, end in chunk_bounds(len(ids), max_length, text, offsets):
            if end - begin < min_length:
                continue
            chunk_offsets = offsets[begin:end] if offsets else None
            yield sampler(ids[begin:end], text=text if offsets else None, offsets=chunk_offsets, rng=rng)


def chunk_bounds(
    n_tokens: int, max_length: int, text: str | None = None, offsets: Offsets | None = None, backoff: int = 8
) -> list[tuple[int, int]]:
    """``[begin, end)`` token ranges of at most ``max_length`` tokens covering ``0..n_tokens``.

    With ``text`` and ``offsets`` a cut moves back by up to ``backoff`` tokens (at most a
    quarter of ``max_length``) to land before a token that starts a word, else between two
    characters, so that no chunk begins inside a word or inside a byte-split character.
    """
    bounds, begin = [], 0
    while begin < n_tokens:
        end = min(begin + max_length, n_tokens)
        if end < n_tokens and offsets is not None and text is not None:
            lowest = max(begin + 1, end - min(backoff, max_length // 4))
            clean = [c for c in range(end, lowest - 1, -1) if offsets[c][0] >= offsets[c - 1][1]]
            words = [c for c in clean if _starts_word(text, offsets[c][0])]
            end = (words or clean or [end])[0]
        bounds.append((begin, end))
        begin = end
    return bounds


def _starts_word(text: str, char: int) -> bool:
    """Whitespace at ``char`` (byte-level BPE keeps it in the token) or just before it (SentencePiece)."""
    return (char < len(text) and text[char].isspace()) or (0 < char <= len(text) and text[char - 1].isspace())
