"""Text <-> mixed ids (LM tokens below V, phrases from V on)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..tokens.segmentation import forward_max_match
from .table import PhraseTable


@dataclass(frozen=True)
class Segment:
    """A span of decoded text: one phrase, or a run of LM tokens."""

    text: str
    is_phrase: bool
    source: str | None = None


def tokenize(text: str, tokenizer, table: PhraseTable, allowed: set[int] | None = None) -> list[int]:
    """Segment ``text`` into LM tokens and phrases by forward maximum matching over token ids.

    ``allowed`` restricts matching to these table indices (one row's phrase set).
    """
    token_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(table) == 0:
        return token_ids

    def lookup(ids: tuple[int, ...]) -> int | None:
        index = table.index_of_ids(ids)
        return index if allowed is None or index in allowed else None

    vocab = table.vocab_size
    return [
        token_ids[start] if index is None else vocab + index
        for start, _, index in forward_max_match(token_ids, lookup, table.max_phrase_tokens)
    ]


def segments(ids: Sequence[int], tokenizer, table: PhraseTable, skip_special_tokens: bool = False,
             sources: Mapping[str, str | None] | None = None) -> list[Segment]:
    """Split mixed ids into phrase segments and runs of tokens, each decoded to text.

    ``sources`` (phrase text -> source) overrides the table's sources where it has the text.
    """
    vocab, result, run = table.vocab_size, [], []

    def flush() -> None:
        if run:
            text = tokenizer.decode(run, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
            if text:
                result.append(Segment(text, False))
            run.clear()

    for token in (int(i) for i in ids):
        if token < vocab:
            run.append(token)
            continue
        if token - vocab >= len(table):
            raise ValueError(f"id {token} is past the vocabulary: V={vocab} plus {len(table)} phrases")
        flush()
        phrase = table.phrases[token - vocab]
        source = sources.get(phrase.text, phrase.source) if sources is not None else phrase.source
        result.append(Segment(phrase.text, True, source))
    flush()
    return result


def decode(ids: Sequence[int], tokenizer, table: PhraseTable, skip_special_tokens: bool = False) -> str:
    """Text of mixed ids."""
    return "".join(s.text for s in segments(ids, tokenizer, table, skip_special_tokens))


class PhraseAwareDecoder:
    """A tokenizer stand-in whose ``decode`` knows the phrases (for ``TextStreamer`` and friends)."""

    def __init__(self, tokenizer, table: PhraseTable) -> None:
        self.tokenizer, self.table = tokenizer, table

    def decode(self, ids, skip_special_tokens: bool = False, **_) -> str:
        return decode(list(ids), self.tokenizer, self.table, skip_special_tokens)
