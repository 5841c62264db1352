"""Phrase extraction: frequent token or word n-grams of retrieved documents, as ``Phrase`` objects.

A phrase starts at the start of a word and ends at the end of one (judged on the
text through the tokenizer's character offsets, so byte-level ``Ġ`` and
SentencePiece ``▁`` tokenizers behave alike), stays inside one sentence, and holds
at least one word that is not a stopword. A token phrase's text is exactly what its
tokens cover, so it keeps the space its first token carries (GPT-2: " New York City"),
and it can stand in for those tokens.
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import accumulate
from typing import Any, Literal, NamedTuple

from dynvocab import Phrase
from dynvocab.decoding.context_gate import left_contexts

logger = logging.getLogger(__name__)

Unit = Literal["tokens", "words"]
Edges = Literal["any", "content"]
Ranking = Literal["frequency", "relevance"]

# fmt: off
ENGLISH_STOPWORDS: frozenset[str] = frozenset("""
a about above after again against all also am an and any are aren't as at be because been before being below
between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during each
either few for from further had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers
herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself just let's may me
might more most must mustn't my myself neither no nor not now of off on once one only or other ought our ours
ourselves out over own same shall shan't she she'd she'll she's should shouldn't so some such than that that's
the their theirs them themselves then there there's these they they'd they'll they're they've this those
though through to too under until up upon us very was wasn't we we'd we'll we're we've were weren't what
what's when when's where where's whether which while who who's whom whose why why's will with within without
won't would wouldn't yet you you'd you'll you're you've your yours yourself yourselves
""".split())
# fmt: on

#: Words whose trailing period does not end a sentence (besides initials and dotted words like "U.S.").
ABBREVIATIONS = frozenset(
    "al approx ca cf co col dr etc fig ft gen inc jr lt ltd mr mrs ms mt no prof rev sr st vs".split()
)

# A word: a dotted abbreviation ("U.S.", "e.g.") or letters/digits joined by inner hyphens, apostrophes,
# periods or commas ("state-of-the-art", "don't", "3.14", "1,000").
_WORD = re.compile(r"(?:\w\.){2,}|\w+(?:[-'’.,]\w+)*")
# A sentence ends at . ! or ? (plus closing quotes/brackets) before whitespace, or at a newline.
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*\s+|\n")
# Brackets and double quotes: a phrase holds both halves of a pair or neither.
_PAIRED = re.compile(r'[()\[\]"]')
# A double quote weighs more than any bracket nesting, so one sum tracks both.
_QUOTE_WEIGHT = 1 << 20
# Characters that make a token string blank: whitespace and the markers byte-level BPE and SentencePiece use for it.
_BLANK_MARKS = " \t\n\r\u2581ĠĊĉč"
_SPACE_MARKS = " \u2581Ġ"


def extract_phrases(
    documents: Sequence[Mapping[str, Any] | str],
    tokenizer: Any = None,
    *,
    unit: Unit = "tokens",
    min_length: int = 2,
    max_length: int = 8,
    min_count: int = 1,
    max_phrases: int | None = None,
    stopwords: Collection[str] | None = ENGLISH_STOPWORDS,
    split_sentences: bool = True,
    text_field: str = "text",
    edges: Edges = "any",
    ranking: Ranking = "frequency",
) -> list[Phrase]:
    """Phrases of ``min_length``..``max_length`` units from ``documents`` (best-ranked first).

    Args:
        documents: retrieved documents in rank order, as str or dicts with ``text_field``
            and ``"id"`` (a document without an id is named by its position).
        tokenizer: a fast Hugging Face tokenizer (or a ``tokenizers.Tokenizer``); needed
            for ``unit="tokens"``, where lengths count LM tokens.
        unit: ``"tokens"`` (n-grams of LM tokens, the paper's setting) or ``"words"``.
        min_count: drop phrases seen fewer times in all documents together.
        max_phrases: keep at most this many.
        stopwords: a phrase made only of these words (lowercased) and punctuation is dropped.
        split_sentences: no phrase crosses a sentence end or a newline.
        edges: ``"content"`` keeps only constituent-like spans: the first and last word
            are not stopwords (no " of the", " stories typically" is still allowed but
            " was the" is not); ``"any"`` lets a phrase start or end on a function word.
        ranking: ``"frequency"`` (count over all documents) or ``"relevance"`` (each
            occurrence weighs ``1 / (1 + rank)`` of its document, so phrases of the
            best-retrieved documents come first).

    Returns:
        Phrases ranked as ``ranking`` says, ties by the first document (then position) holding
        them; ``source`` is the id of the best-ranked document holding the phrase. With
        ``unit="tokens"`` the text starts with the space its first token carries, if any.
    """
    _check_arguments(unit, tokenizer, min_length, max_length, min_count, max_phrases)
    if edges not in ("any", "content") or ranking not in ("frequency", "relevance"):
        raise ValueError(f"edges={edges!r} and ranking={ranking!r}: choose edges 'any' or 'content', "
                         "ranking 'frequency' or 'relevance'")
    texts, sources = _texts_and_sources(documents, text_field)
    stop = frozenset(w.lower() for w in stopwords) if stopwords else frozenset()
    edge_stop = stop if edges == "content" else frozenset()
    settings = (unit, min_length, max_length, stop, split_sentences, edge_stop, _vocabulary_size(tokenizer))
    cache = _NGRAM_COUNTS.of(tokenizer if unit == "tokens" else _WORD_UNITS)
    per_document = [cache.get((text, settings)) if cache is not None else None for text in texts]
    missing = [number for number, found in enumerate(per_document) if found is None]
    units = _units([texts[number] for number in missing], unit, tokenizer, stop, split_sentences, edge_stop)
    for number, doc_units in zip(missing, units):
        per_document[number] = Counter(_ngram_keys(texts[number], doc_units, min_length, max_length))
        if cache is not None:
            cache.put((texts[number], settings), per_document[number])
    # Counts hold only str -> int, nothing for the garbage collector to walk; the Counter keeps
    # first-seen order, which is the tie-break and tells which document held a phrase first.
    counts: Counter[str] = Counter()
    weights: Counter[str] = Counter()  # relevance: occurrences weighted by 1 / (1 + document rank)
    first_source: list[str] = []  # source of the i-th distinct phrase
    for rank, (found, source) in enumerate(zip(per_document, sources)):
        counts.update(found)
        if ranking == "relevance":
            weights.update({key: count / (1 + rank) for key, count in found.items()})
        first_source += [source] * (len(counts) - len(first_source))
    keys, values = list(counts), list(counts.values())
    order = values if ranking == "frequency" else [weights[key] for key in keys]
    ranked = sorted(range(len(keys)), key=order.__getitem__, reverse=True)  # stable: ties keep first-seen order
    ranked = [position for position in ranked if values[position] >= min_count][:max_phrases]
    return list(map(Phrase, [keys[p] for p in ranked], [first_source[p] for p in ranked]))


def tokenized_phrases(phrases: Sequence[Phrase], tokenizer: Any, max_tokens: int,
                      tokenize: Callable[[list[str]], Sequence[Sequence[int]]] | None = None) -> list[tuple[Phrase, tuple[int, ...]]]:
    """The ``phrases`` a phrase table takes, with their token ids: 2 to ``max_tokens`` tokens and no special token
    (a phrase's text may re-tokenize longer than the n-gram it was cut as). ``tokenize`` (texts -> token ids, such as
    the table's remembering ``PhraseTable.tokenize``) replaces the tokenizer's own call."""
    if not phrases:
        return []
    texts = [p.text for p in phrases]
    encoded = tokenize(texts) if tokenize is not None else tokenizer(texts, add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    return [(p, tuple(ids)) for p, ids in zip(phrases, encoded) if 2 <= len(ids) <= max_tokens and special.isdisjoint(ids)]


def document_contexts(documents: Sequence[Mapping[str, Any] | str], tokenizer: Any, phrase_token_ids: Collection[tuple[int, ...]],
                      context_tokens: int, text_field: str = "text") -> dict[tuple[int, ...], set[tuple[int, ...]]]:
    """``{context_tokens tokens: {phrases that follow them}}`` in ``documents``, for ``generate(phrase_contexts=...)``."""
    texts, _ = _texts_and_sources(documents, text_field)
    return left_contexts((ids for ids, _ in _tokenize(tokenizer, texts)), phrase_token_ids, context_tokens)


def _units(texts: list[str], unit: Unit, tokenizer: Any, stop: frozenset[str], split_sentences: bool,
           edge_stop: frozenset[str]) -> list[_Units]:
    """Each text cut into units (tokens or words), the runs of which are its phrases."""
    if unit == "words":
        return [_word_units(text, stop, split_sentences, edge_stop) for text in texts]
    if not texts:
        return []
    encodings = _tokenize(tokenizer, texts)
    blank, spaced = _whitespace_token_ids(tokenizer, encodings)
    return [_token_units(text, ids, offsets, blank, spaced, stop, split_sentences, edge_stop)
            for text, (ids, offsets) in zip(texts, encodings)]


class _DocumentNgrams:
    """Each document's n-gram counts by its text and the extraction settings, per tokenizer: the documents a retriever
    returns come back request after request, and cutting them is most of extraction's time (0.2-0.4 s for 32 licences
    on 2 CPU cores). A tokenizer's documents leave, least recently used first, once they hold more than ``limit``
    distinct n-grams (about 100 bytes each)."""

    def __init__(self, limit: int = 2_000_000) -> None:
        self.limit = limit
        self._caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> _DocumentNgramCache

    def of(self, tokenizer: Any) -> _DocumentNgramCache | None:
        """The cache of ``tokenizer``'s documents; None for one that cannot be referred to weakly (nothing is kept)."""
        try:
            if tokenizer not in self._caches:
                self._caches[tokenizer] = _DocumentNgramCache(self.limit)
        except TypeError:
            return None
        return self._caches[tokenizer]


class _DocumentNgramCache:
    """One tokenizer's documents: (text, settings) -> n-gram counts, at most ``limit`` n-grams in all (the server's
    threads share it)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size = limit, 0
        self._counts: OrderedDict[tuple, Counter[str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Counter[str] | None:
        with self._lock:
            found = self._counts.get(key)
            if found is not None:
                self._counts.move_to_end(key)
            return found

    def put(self, key: tuple, found: Counter[str]) -> None:
        with self._lock:
            if key in self._counts or len(found) > self.limit:
                return
            self._counts[key] = found
            self.size += len(found)
            while self.size > self.limit:
                self.size -= len(self._counts.popitem(last=False)[1])


def _vocabulary_size(tokenizer: Any) -> int | None:
    """How many tokens ``tokenizer`` knows, added ones included (a token added later cuts a text otherwise)."""
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "get_vocab_size"):  # a tokenizers.Tokenizer
        return tokenizer.get_vocab_size(with_added_tokens=True)
    return len(tokenizer)


class _WordUnits:
    """Stands for the tokenizer of word-unit extraction, which needs none."""


_WORD_UNITS = _WordUnits()
#: every process's cut documents (``extract_phrases``)
_NGRAM_COUNTS = _DocumentNgrams()


def forget_cut_documents() -> None:
    """Drop the n-gram counts ``extract_phrases`` keeps of the documents it cut (to free their memory, or to time a
    first cut)."""
    global _NGRAM_COUNTS
    _NGRAM_COUNTS = _DocumentNgrams(_NGRAM_COUNTS.limit)


def _check_arguments(unit: str, tokenizer: Any, min_length: int, max_length: int, min_count: int,
                     max_phrases: int | None) -> None:
    if unit not in ("tokens", "words"):
        raise ValueError(f"unit={unit!r} is not supported; use 'tokens' or 'words'")
    if unit == "tokens" and tokenizer is None:
        raise ValueError("unit='tokens' needs the LM's tokenizer; pass tokenizer= or use unit='words'")
    if not (isinstance(min_length, int) and isinstance(max_length, int) and 1 <= min_length <= max_length):
        raise ValueError(f"min_length={min_length!r} and max_length={max_length!r} need 1 <= min_length <= max_length")
    if not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count={min_count!r} must be a positive int")
    if max_phrases is not None and (not isinstance(max_phrases, int) or max_phrases < 0):
        raise ValueError(f"max_phrases={max_phrases!r} must be None or an int >= 0")


def _texts_and_sources(documents: Sequence[Mapping[str, Any] | str], text_field: str) -> tuple[list[str], list[str]]:
    if isinstance(documents, (str, Mapping)):
        raise TypeError("documents must be a list of str or dicts, not a single document; wrap it in a list")
    texts, sources = [], []
    for position, document in enumerate(documents):
        if isinstance(document, str):
            texts.append(document)
            sources.append(str(position))
        elif isinstance(document, Mapping) and isinstance(document.get(text_field), str):
            texts.append(document[text_field])
            sources.append(str(document.get("id", position)))
        else:
            raise TypeError(f"documents[{position}] must be a str or a dict with a str {text_field!r} field")
    return texts, sources


def _tokenize(tokenizer: Any, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Token ids and character offsets of every text, in one batched call."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if hasattr(backend, "encode_batch"):
        return [(e.ids, e.offsets) for e in backend.encode_batch(texts, add_special_tokens=False)]
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"{type(tokenizer).__name__} is a slow tokenizer without character offsets; "
            "pass a fast one (AutoTokenizer.from_pretrained(..., use_fast=True))"
        )
    batch = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return list(zip(batch["input_ids"], batch["offset_mapping"]))


def _whitespace_token_ids(tokenizer: Any, encodings: list[tuple[list[int], list]]) -> tuple[set[int], set[int]]:
    """Ids (among those used) of tokens that are only whitespace (a lone SentencePiece '▁'), and of tokens
    that start with a space marker ('Ġthe', '▁the')."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    to_token = backend.id_to_token if hasattr(backend, "id_to_token") else tokenizer.convert_ids_to_tokens
    used = set().union(*(ids for ids, _ in encodings)) if encodings else set()
    strings = {i: to_token(i) or "" for i in used}
    blank = {i for i, token in strings.items() if not token.strip(_BLANK_MARKS)}
    spaced = {i for i, token in strings.items() if token[:1] in _SPACE_MARKS}
    return blank, spaced


def _sentence_breaks(text: str, word_ends: dict[int, str]) -> list[int]:
    """Character positions where a new sentence starts."""
    breaks = []
    for match in _SENTENCE_END.finditer(text):
        period = match.start()
        if text[period] == ".":
            if period + 1 in word_ends:  # the period is part of a dotted abbreviation ("U.S.")
                continue
            word = word_ends.get(period, "")
            if len(word) == 1 or word.lower() in ABBREVIATIONS:
                continue
        breaks.append(match.end())
    breaks.append(len(text) + 1)
    return breaks


def _word_marks(text: str, stop: frozenset[str]) -> tuple[list[tuple[int, int, str]], bytearray, bytearray, bytearray]:
    """Words, and per-character marks: word starts, word ends, characters of non-stopwords."""
    words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(text)]
    starts, ends, content = bytearray(len(text) + 1), bytearray(len(text) + 1), bytearray(len(text) + 1)
    for start, end, word in words:
        starts[start] = 1
        ends[end] = 1
        if word.lower() not in stop:
            content[start:end] = b"\x01" * (end - start)
    return words, starts, ends, content


class _Units(NamedTuple):
    """Per-unit (token or word) data of one document; a phrase is a run of units."""

    leads: list[int]  # where the phrase text starts: the unit's start, or the space its token carries
    starts: list[int]  # character span, whitespace trimmed
    ends: list[int]
    can_start: list[bool]  # the unit starts a word
    can_end: list[bool]  # the unit ends a word
    sentence: list[int]
    content: list[int]  # prefix sums: non-stopword units before position i
    nesting_before: list[int]  # bracket/quote nesting at the unit's start and end
    nesting_after: list[int]


def _token_units(text: str, ids: list[int], offsets: list[tuple[int, int]], blank: set[int], spaced: set[int],
                 stop: frozenset[str], split_sentences: bool, edge_stop: frozenset[str] = frozenset()) -> _Units:
    words, word_starts, word_ends, content = _word_marks(text, stop)
    for start, end, word in words:  # a stopword may sit inside a phrase but not at its edge
        if word.lower() in edge_stop:
            word_starts[start], word_ends[end] = 0, 0
    breaks = _sentence_breaks(text, {end: word for _, end, word in words}) if split_sentences else [len(text) + 1]
    n = len(ids)
    cs, ce, can_start, can_end, seg, prefix = [0] * n, [0] * n, [False] * n, [False] * n, [0] * n, [0] * (n + 1)
    lead = [0] * n
    sentence, next_break, last = 0, breaks[0], -1  # last: previous non-blank token
    for i in range(n):
        start, end = offsets[i]
        lead[i] = start
        while start < end and text[start].isspace():
            start += 1
        if lead[i] == start and start > 0 and ids[i] in spaced and text[start - 1] == " ":
            lead[i] = start - 1  # offsets trimmed of the space the token carries
        elif start - lead[i] > 1 or (start > lead[i] and text[lead[i]] != " "):
            lead[i] = start  # a phrase may start with one space, never with a newline or a run of spaces
        while end > start and text[end - 1].isspace():
            end -= 1
        while start >= next_break:
            sentence += 1
            next_break = breaks[sentence]
        cs[i], ce[i], seg[i] = start, end, sentence
        has_content = start < end and ids[i] not in blank
        if has_content:
            # Byte-fallback pieces of one character share offsets: never cut between them.
            overlaps = last >= 0 and ce[last] > start
            can_start[i] = word_starts[start] == 1 and not overlaps
            can_end[i] = word_ends[end] == 1
            if overlaps:
                can_end[last] = False
            last = i
        prefix[i + 1] = prefix[i] + (has_content and content.find(1, start, end) >= 0)
    return _Units(lead, cs, ce, can_start, can_end, seg, prefix, *_nesting(text, cs, ce))


def _word_units(text: str, stop: frozenset[str], split_sentences: bool, edge_stop: frozenset[str] = frozenset()) -> _Units:
    words, _, _, _ = _word_marks(text, stop)
    breaks = _sentence_breaks(text, {end: word for _, end, word in words}) if split_sentences else [len(text) + 1]
    cs, ce, seg, prefix = [], [], [], [0]
    sentence = 0
    for start, end, word in words:
        while start >= breaks[sentence]:
            sentence += 1
        cs.append(start)
        ce.append(end)
        seg.append(sentence)
        prefix.append(prefix[-1] + (word.lower() not in stop))
    flags = [word.lower() not in edge_stop for _, _, word in words]
    return _Units(cs, cs, ce, flags, flags, seg, prefix, *_nesting(text, cs, ce))


def _nesting(text: str, starts: list[int], ends: list[int]) -> tuple[list[int], list[int]]:
    """Bracket and double-quote nesting before each unit's start and at its end.

    A phrase whose nesting differs at its two ends opens or closes a bracket or quote
    it does not contain the other half of ("the (big", "big) thing").
    """
    marks = list(_PAIRED.finditer(text))
    if not marks:
        zeros = [0] * len(starts)
        return zeros, zeros
    delta, quote = [0] * (len(text) + 1), _QUOTE_WEIGHT
    for mark in marks:
        if mark.group() == '"':  # quotes alternate between opening and closing
            delta[mark.end()], quote = quote, -quote
        else:
            delta[mark.end()] = 1 if mark.group() in "([" else -1
    depth = list(accumulate(delta))
    return [depth[start] for start in starts], [depth[end] for end in ends]


def _ngram_keys(text: str, units: _Units, min_length: int, max_length: int) -> list[str]:
    """The text of every valid n-gram of ``units``, in order of their starts."""
    leads, _, ce, can_start, can_end, seg, prefix, nesting_before, nesting_after = units
    n = len(ce)
    keys: list[str] = []
    append = keys.append
    for i in range(n):
        if not can_start[i]:
            continue
        start, sentence, content_before, nesting = leads[i], seg[i], prefix[i], nesting_before[i]
        for j in range(i + min_length - 1, min(n, i + max_length)):
            if seg[j] != sentence:
                break
            if can_end[j] and prefix[j + 1] != content_before and nesting_after[j] == nesting:
                append(text[start : ce[j]])
    return keys
