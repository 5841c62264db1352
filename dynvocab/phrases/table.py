"""Phrases and the table that gives each one an id past the LM's vocabulary."""

from __future__ import annotations

import json
import unicodedata
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..io.jsonl import iter_jsonl

#: phrases tokenized per call in ``PhraseTable.validate``: the tokenizer's output for a million
#: texts at once is garbage of several hundred MB that the allocator then keeps
VALIDATE_CHUNK = 16384
#: phrase texts whose token ids a table remembers (least recently used go first), so a request's phrases are
#: tokenized once whether the pipeline, the context gate or the table asks first (about 10 ms per 2,048)
TOKEN_MEMO_SIZE = 65536


@dataclass(frozen=True, slots=True)
class Phrase:
    """A text span used as one token; ``source`` names the document it came from (for citations)."""

    text: str
    source: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"Phrase.text must be a str, got {type(self.text).__name__} {self.text!r}")
        try:
            self.text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"phrase {self.text!r} is not valid Unicode: {error.reason} at character {error.start}; decode its "
                "bytes with errors='replace' (or drop the stray character) before adding it"
            ) from None
        if self.source is not None and not isinstance(self.source, str):
            raise TypeError(
                f"Phrase.source must be a str (a document id) or None, got {type(self.source).__name__} "
                f"{self.source!r}; pass source=str(...)"
            )


PhraseLike = str | Phrase


def phrase_list(items: Iterable[PhraseLike], argument: str = "phrases") -> list:
    """``items`` read once into a list; a single phrase or a non-iterable raises ``TypeError`` naming ``argument``."""
    if isinstance(items, (str, Phrase)):
        raise TypeError(f"{argument} must be a list of phrases, got the single phrase {items!r}; pass [{items!r}]")
    if isinstance(items, (bytes, bytearray, memoryview)):
        raise TypeError(f"{argument} must be a list of phrases (str), got {type(items).__name__} {bytes(items)[:40]!r}; "
                        "decode the bytes and wrap the text in a list: [data.decode('utf-8')]")
    try:
        return list(items)
    except TypeError:
        raise TypeError(
            f"{argument} must be a list of phrases (str or dynvocab.Phrase), got {type(items).__name__} {items!r}"
        ) from None


def _invisible(text: str) -> bool:
    """Only spaces, controls, format characters (zero-width space, BOM...) or separators: nothing a reader sees."""
    return all(character.isspace() or unicodedata.category(character)[0] in "CZ" for character in text)


def as_phrase(item: PhraseLike) -> Phrase:
    """A ``Phrase`` from a ``str`` or ``Phrase``; anything else raises ``TypeError``."""
    if isinstance(item, Phrase):
        return item
    if isinstance(item, str):
        return Phrase(item)
    raise TypeError(f"a phrase must be a str or dynvocab.Phrase, got {type(item).__name__}: {item!r}")


class PhraseTable:
    """Ordered unique phrases with ids ``V .. V + len(table) - 1`` and their cached vectors.

    Each entry keeps its text, its token ids under the LM's tokenizer and its source.
    Phrases are validated on the way in; a duplicate text merges into the existing
    entry (keeping the first source). A removed phrase keeps its entry and id, so ids
    already emitted keep their meaning; it is no longer matched, scored or listed, and
    adding it again brings it back. Only :meth:`keep` (a new phrase set) renumbers. Output vectors (needed to score every phrase)
    are filled by the model for new phrases only; input vectors (needed only for
    phrases fed back as inputs) are cached as they are first used.
    """

    def __init__(self, tokenizer, vocab_size: int, max_phrase_tokens: int = 8) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_phrase_tokens = max_phrase_tokens
        self.phrases: list[Phrase] = []
        self.token_ids: list[tuple[int, ...]] = []
        self._index: dict[str, int] = {}
        self._by_ids: dict[tuple[int, ...], int] = {}
        self.output_vectors: torch.Tensor | None = None
        self.input_vectors: dict[int, torch.Tensor] = {}
        self.removed: set[int] = set()  # table indices removed since the last keep(): decodable, never emitted
        self._row_masks: torch.Tensor | None = None  # (rows, width) per-row sets of set_rows; None: all rows share
        self._row_sources: list[dict[str, str | None]] | None = None
        self._shared_ints: dict[int, int] = {}
        self._token_memo: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self.version = 0  # bumped whenever the phrases or their order change (derived lookups key on it)
        #: objects kept in step with the table (a shortlist scorer), held weakly: told ``phrases_kept(indices)``
        #: and ``vectors_forgotten()``
        self.listeners: weakref.WeakSet = weakref.WeakSet()

    def __len__(self) -> int:
        return len(self.phrases)

    def __contains__(self, item: PhraseLike) -> bool:
        index = self._index.get(as_phrase(item).text)
        return index is not None and index not in self.removed

    def id_of(self, item: PhraseLike) -> int:
        """The vocabulary id of a phrase in the table."""
        text = as_phrase(item).text
        if text not in self._index:
            raise KeyError(f"phrase {text!r} is not in the phrase table")
        return self.vocab_size + self._index[text]

    def spell(self, ids) -> list[int]:
        """Mixed ids (tokens below ``vocab_size``, phrases from it on) as the LM token ids they spell."""
        return [t for i in ids for t in (self.token_ids[i - self.vocab_size] if i >= self.vocab_size else (i,))]

    def index_of_ids(self, token_ids: tuple[int, ...]) -> int | None:
        """Table index of the (not removed) phrase with exactly these token ids, or None."""
        index = self._by_ids.get(token_ids)
        return None if index in self.removed else index

    def live_indices(self) -> list[int]:
        """Table indices of the phrases that are not removed."""
        return [i for i in range(len(self.phrases)) if i not in self.removed]

    def live_mask(self, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """``(P,)`` bool, False at removed phrases; None when none is removed."""
        if not self.removed:
            return None
        mask = torch.ones(len(self.phrases), dtype=torch.bool)
        mask[sorted(self.removed)] = False
        return mask.to(device)

    def remove(self, indices: Iterable[int]) -> None:
        """Remove the phrases at these table indices without renumbering any id."""
        before = len(self.removed)
        self.removed.update(indices)
        self.version += len(self.removed) != before

    @property
    def num_encoded(self) -> int:
        return 0 if self.output_vectors is None else self.output_vectors.shape[0]

    def validate(self, items: Iterable[PhraseLike]) -> list[tuple[Phrase, tuple[int, ...]]]:
        """Check and tokenize phrases without changing the table; raises ``ValueError`` naming the bad phrase."""
        phrases = [as_phrase(item) for item in phrase_list(items)]
        for phrase in phrases:
            if _invisible(phrase.text):
                raise ValueError(
                    f"phrase {phrase.text!r} is empty or only whitespace or invisible characters; drop it from the phrase list"
                )
        checked = []
        for start in range(0, len(phrases), VALIDATE_CHUNK):
            checked += self._tokenized(phrases[start : start + VALIDATE_CHUNK])
        return checked

    def _tokenized(self, phrases: list[Phrase]) -> list[tuple[Phrase, tuple[int, ...]]]:
        """``validate``'s length checks on one chunk; token ids are shared int objects (a million phrases
        otherwise hold several million separate ints)."""
        special = set(getattr(self.tokenizer, "all_special_ids", ()))
        checked = []
        for phrase, ids in zip(phrases, self.tokenize([p.text for p in phrases])):
            inside = [i for i in ids if i in special]
            if inside:
                raise ValueError(
                    f"phrase {phrase.text!r} contains the special token {self.tokenizer.convert_ids_to_tokens(inside[0])!r}: "
                    "a phrase is text the model writes, and decoding could not drop its special token as it drops "
                    "one outside a phrase; remove it from the phrase"
                )
            if len(ids) < 2:
                raise ValueError(
                    f"phrase {phrase.text!r} is a single token of the LM's vocabulary (id {ids[0] if ids else None}); "
                    "a phrase must span at least 2 tokens"
                )
            if len(ids) > self.max_phrase_tokens:
                raise ValueError(
                    f"phrase {phrase.text!r} has {len(ids)} tokens, more than max_phrase_tokens="
                    f"{self.max_phrase_tokens}; shorten it or raise max_phrase_tokens in the config"
                )
            checked.append((phrase, ids))
        return checked

    def tokenize(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Token ids of ``texts`` under the LM's tokenizer, no special tokens added; the last ``TOKEN_MEMO_SIZE``
        texts are remembered, so only texts not seen lately reach the tokenizer."""
        memo, shared = self._token_memo, self._shared_ints
        missing = list(dict.fromkeys(text for text in texts if text not in memo))
        if missing:
            encoded = self.tokenizer(missing, add_special_tokens=False, return_attention_mask=False)["input_ids"]
            for text, ids in zip(missing, encoded):
                memo[text] = tuple(shared.setdefault(i, i) for i in ids)
        found = []
        for text in texts:
            memo.move_to_end(text)
            found.append(memo[text])
        while len(memo) > TOKEN_MEMO_SIZE:
            memo.popitem(last=False)
        return found

    def with_mid_sentence_forms(self, items: Iterable[PhraseLike]) -> list[Phrase]:
        """``items`` plus, for each phrase written without a leading space ("New York City"), the form
        running text uses mid-sentence (" New York City", same source), when the tokenizer folds
        that space into the first token (GPT-2 and Llama-3-style byte-level BPE do) and the form is a
        phrase (two tokens or more)."""
        phrases = [as_phrase(p) for p in phrase_list(items)]
        plain = [p for p in phrases if p.text[:1].isalnum()]
        if not plain:
            return phrases
        ids = self.tokenize([p.text for p in plain] + [" " + p.text for p in plain])
        spaced = [
            Phrase(" " + p.text, p.source)
            for p, bare, with_space in zip(plain, ids[: len(plain)], ids[len(plain) :])
            if 2 <= len(with_space) <= len(bare) and with_space != bare
        ]
        return phrases + spaced

    def add(self, items: Iterable[PhraseLike]) -> list[int]:
        """Add phrases (validated first, all or nothing). Returns the table indices that are new."""
        return self.add_validated(self.validate(items))

    def add_validated(self, checked: Iterable[tuple[Phrase, tuple[int, ...]]]) -> list[int]:
        """Add ``(phrase, token_ids)`` pairs from ``validate``. Returns the table indices that are new."""
        new, revived = [], False
        for phrase, ids in checked:
            if phrase.text in self._index or ids in self._by_ids:
                index = self._index.get(phrase.text, self._by_ids.get(ids))
                if index in self.removed:  # added again: the entry, its id and its vectors come back
                    self.removed.discard(index)
                    revived = True
                continue
            self._index[phrase.text] = len(self.phrases)
            self._by_ids[ids] = len(self.phrases)
            self.phrases.append(phrase)
            self.token_ids.append(ids)
            new.append(len(self.phrases) - 1)
        self.version += bool(new) or revived
        return new

    def update_sources(self, phrases: Iterable[Phrase]) -> None:
        """Give entries already in the table the sources of ``phrases`` (the first per text wins).

        A replaced phrase set reuses entries (and their vectors) by text; their sources must be the new set's.
        """
        updated = set()
        for phrase in phrases:
            index = self._index.get(phrase.text)
            if index is not None and phrase.text not in updated:
                updated.add(phrase.text)
                self.phrases[index] = phrase

    # ------------------------------------------------------------------ the phrase set, shared or per batch row
    def set_rows(self, rows: Sequence[Sequence[PhraseLike]], per_row: bool, mid_sentence_forms: bool = True) -> None:
        """Make the table exactly the phrases of ``rows`` (kept ones keep their vectors; ids renumber).

        With ``per_row`` each batch row may use only its own list (and phrases added later); otherwise
        ``rows`` holds one list that every row shares. A text may come from different documents in
        different rows: each row keeps its own sources. With ``mid_sentence_forms`` a phrase also enters
        in the form running text uses (:meth:`with_mid_sentence_forms`).
        """
        expand = self.with_mid_sentence_forms if mid_sentence_forms else list
        checked = [self.validate(expand(row)) for row in rows]
        wanted = {p.text for row in checked for p, _ in row}
        self.keep([i for i, p in enumerate(self.phrases) if p.text in wanted])
        for row in checked:
            self.add_validated(row)
        self.update_sources(p for row in checked for p, _ in row)
        if per_row:
            masks = torch.zeros(len(checked), len(self), dtype=torch.bool)
            for r, row in enumerate(checked):
                masks[r, [self.id_of(p) - self.vocab_size for p, _ in row]] = True
            self._row_masks = masks
            self._row_sources = [{p.text: p.source for p, _ in reversed(row)} for row in checked]

    @property
    def num_rows(self) -> int | None:
        """How many per-row sets :meth:`set_rows` made; None when every row shares the table."""
        return None if self._row_masks is None else self._row_masks.shape[0]

    def row_masks(self) -> torch.Tensor | None:
        """``(rows, len(self))``: which phrases each row may use (phrases added since :meth:`set_rows` are
        shared by every row); None when every row shares the table."""
        masks = self._row_masks
        if masks is not None and masks.shape[1] < len(self):
            masks = torch.cat([masks, masks.new_ones(masks.shape[0], len(self) - masks.shape[1])], dim=1)
            self._row_masks = masks
        return masks

    def row_sources(self, row: int) -> dict[str, str | None] | None:
        """Phrase text -> source document in ``row``'s own set; None when every row shares the table."""
        if self._row_sources is None:
            return None
        if not 0 <= row < len(self._row_sources):
            raise ValueError(f"row={row} but the phrase sets have {len(self._row_sources)} rows")
        return self._row_sources[row]

    def keep(self, indices: Sequence[int]) -> None:
        """Keep only the phrases at these table indices, in this order, with their vectors (ids renumber).

        Per-row sets end here (their ids would no longer hold): :meth:`set_rows` makes new ones.
        """
        self.removed = set()
        self._row_masks = self._row_sources = None
        self.phrases = [self.phrases[i] for i in indices]
        self.token_ids = [self.token_ids[i] for i in indices]
        self.version += 1
        self._index = {p.text: i for i, p in enumerate(self.phrases)}
        self._by_ids = {ids: i for i, ids in enumerate(self.token_ids)}
        old_to_new = {old: new for new, old in enumerate(indices)}
        self.input_vectors = {old_to_new[i]: v for i, v in self.input_vectors.items() if i in old_to_new}
        if self.output_vectors is not None:
            encoded = [i for i in indices if i < self.output_vectors.shape[0]]
            index = torch.tensor(encoded, dtype=torch.long, device=self.output_vectors.device)
            self.output_vectors = self.output_vectors[index]
        for listener in self.listeners:
            listener.phrases_kept(indices)

    def forget_vectors(self) -> None:
        """Drop every cached vector (the encoder changed)."""
        self.output_vectors = None
        self.input_vectors = {}
        for listener in self.listeners:
            listener.vectors_forgotten()

    def append_output_vectors(self, outputs: torch.Tensor) -> None:
        """Cache output vectors of the next ``len(outputs)`` phrases. ``(n, d)``."""
        self.output_vectors = outputs if self.output_vectors is None else torch.cat([self.output_vectors, outputs])

    def save(self, path: str | Path) -> None:
        """Write the phrases that are not removed as JSON lines (text, source)."""
        with open(path, "w", encoding="utf-8") as f:
            for phrase in (self.phrases[i] for i in self.live_indices()):
                f.write(json.dumps({"text": phrase.text, "source": phrase.source}, ensure_ascii=False) + "\n")

    @staticmethod
    def read(path: str | Path) -> list[Phrase]:
        """Phrases from a JSON-lines file written by ``save``."""
        phrases = []
        for number, record in iter_jsonl(path, fix='each line must be {"text": ..., "source": ...}'):
            if "text" not in record:
                raise ValueError(f"{path}:{number} has no 'text' field; each line must be {{\"text\": ..., \"source\": ...}}")
            phrases.append(Phrase(record["text"], record.get("source")))
        return phrases
