"""Repetition control that sees a phrase as the tokens it stands for.

``transformers``' own ``no_repeat_ngram_size`` and ``repetition_penalty`` compare ids,
so a phrase id never matches the tokens it spells and a phrase can loop freely. These
logits processors expand every row's mixed ids into LM tokens first; ``generate``
of ``DynamicVocabLM`` uses them in place of the built-in ones when those arguments
are given.

The penalty compares token runs through an integer hash ``sum(t_i * V**(n-1-i))``; it is
exact while ``V**n < 2**63`` (GPT-2 and SmolLM2 vocabularies up to n = 4) and a wrapping
hash beyond that, where a spurious match is possible but vanishingly rare. The n-gram
rule compares tuples of tokens, exactly.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from .readback import expansion_table

__all__ = ["NO_REPEAT_SCOPES", "PhraseMaxUses", "PhraseNGrams", "PhraseNoRepeatNGram", "PhraseRepetitionPenalty",
           "check_no_repeat_scope"]


class PhraseMaxUses(LogitsProcessor):
    """Each phrase at most ``max_uses`` times per row; its tokens stay allowed, so the text may still say it again.

    A phrase is a shortcut to text the row has not written yet; emitting the same
    phrase over and over is how a dynamic-vocabulary model loops. Counts only phrase
    ids (``>= vocab_size``), which a prompt never holds.
    """

    def __init__(self, max_uses: int, vocab_size: int) -> None:
        if not isinstance(max_uses, int) or isinstance(max_uses, bool) or max_uses < 1:
            raise ValueError(f"phrase_max_uses must be a positive int, got {max_uses!r}")
        self.max_uses, self.vocab_size = max_uses, vocab_size

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """``(B, L)`` mixed ids, ``(B, V + P)`` scores -> the same scores with used-up phrases at ``-inf``."""
        phrases = (input_ids - self.vocab_size).clamp(min=-1)
        counts = torch.zeros(scores.shape[0], scores.shape[1] - self.vocab_size + 1, dtype=torch.long, device=scores.device)
        counts.scatter_add_(1, phrases.to(scores.device) + 1, torch.ones_like(phrases, device=scores.device))
        used_up = counts[:, 1:] >= self.max_uses  # column 0 counted the tokens
        return torch.cat([scores[:, : self.vocab_size], scores[:, self.vocab_size :].masked_fill(used_up, float("-inf"))], 1)


#: what ``PhraseNoRepeatNGram`` counts as already written
NO_REPEAT_SCOPES = ("all", "new")


class PhraseNoRepeatNGram(LogitsProcessor):
    """``no_repeat_ngram_size`` over the tokens phrases spell: no id may complete an n-gram the row already has.

    A token is banned as usual; a phrase is banned when any n-gram that its tokens would
    end (with the row's last ``n - 1`` tokens before it) is already in the row.
    ``scope="all"`` counts the prompt's n-grams too (``transformers``' rule); ``scope="new"``
    counts only what this ``generate`` call writes (the columns after those of its first
    call), so an answer may copy its documents from the prompt but never repeat itself.

    Each row keeps a record that a step extends by the n-grams it adds, as ``transformers``'
    processor keeps its n-gram dicts: the phrases holding a written n-gram inside them, and
    for every start of a written n-gram what followed it, so a step looks up the row's last
    tokens instead of comparing every phrase's n-grams with the text. A row that does not
    extend the last one seen (beam search reorders rows, verified decoding goes back) is
    rebuilt. ``phrase_ngrams`` passes the phrases' lookups built before (``PhraseNGrams``).
    """

    def __init__(self, ngram_size: int, vocab_size: int, phrase_token_ids: list[tuple[int, ...]], scope: str = "all",
                 phrase_ngrams: "PhraseNGrams | None" = None) -> None:
        if not isinstance(ngram_size, int) or ngram_size < 1:
            raise ValueError(f"no_repeat_ngram_size must be a positive int, got {ngram_size!r}")
        check_no_repeat_scope(scope)
        self.n, self.scope, self.vocab_size = ngram_size, scope, vocab_size
        if phrase_ngrams is not None and phrase_ngrams.n != ngram_size:
            raise ValueError(f"phrase_ngrams were built for n = {phrase_ngrams.n}, not no_repeat_ngram_size="
                             f"{ngram_size}; build them with PhraseNGrams(no_repeat_ngram_size, phrase_token_ids) or "
                             "leave them out")
        self.phrase_ngrams = phrase_ngrams or PhraseNGrams(ngram_size, phrase_token_ids)
        self._prompt_width: int | None = None
        self._rows: dict[int, _NGramRecord] = {}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._prompt_width is None:
            self._prompt_width = input_ids.shape[1] if self.scope == "new" else 0
        rows, columns = [], []
        for row, ids in enumerate(input_ids[:, self._prompt_width :].tolist()):
            banned = self._banned(self._record(row, ids))
            rows += [row] * len(banned)
            columns += banned
        if not columns:
            return scores
        where = torch.tensor([rows, columns], dtype=torch.long).to(scores.device)
        return scores.index_put((where[0], where[1]), scores.new_full((), float("-inf")))

    def _record(self, row: int, ids: list[int]) -> "_NGramRecord":
        """Row ``row``'s record, extended to ``ids`` (mixed ids), or rebuilt if ``ids`` does not extend it."""
        record = self._rows.get(row)
        if record is None or ids[: len(record.ids)] != record.ids:
            record = self._rows[row] = _NGramRecord()
        for i in ids[len(record.ids) :]:
            self._extend(record, self.phrase_ngrams.token_ids[i - self.vocab_size] if i >= self.vocab_size else (i,))
        record.ids = ids
        return record

    def _extend(self, record: "_NGramRecord", tokens: tuple[int, ...]) -> None:
        """Append ``tokens`` to ``record`` with the n-grams they end."""
        n = self.n
        for token in tokens:
            record.tokens.append(token)
            if len(record.tokens) < n:
                continue
            gram = tuple(record.tokens[-n:])
            for split in range(n):  # what followed each start of the n-gram (split = 0: the whole n-gram)
                record.followers.setdefault(gram[:split], set()).add(gram[split:])
            record.inside_seen.update(self.phrase_ngrams.inside.get(gram, ()))

    def _banned(self, record: "_NGramRecord") -> list[int]:
        """Columns (token ids, and ``V + i`` for phrase ``i``) that would repeat one of the row's n-grams."""
        n, tokens = self.n, record.tokens
        if len(tokens) + 1 < n:
            return []
        context = tuple(tokens[len(tokens) - n + 1 :])
        banned = [rest[0] for rest in record.followers.get(context, ())]
        phrases = set(record.inside_seen)
        for start in range(len(context)):  # an n-gram that starts at context[start] and ends inside the phrase
            for rest in record.followers.get(context[start:], ()):
                phrases.update(self.phrase_ngrams.starting.get(rest, ()))
        return banned + [self.vocab_size + phrase for phrase in phrases]


class PhraseNGrams:
    """What ``PhraseNoRepeatNGram`` looks up of the phrases: their tokens, the phrases that hold each n-gram inside
    them, and those that start with each run of ``1 .. n - 1`` tokens (an n-gram that ends inside a phrase starts in
    the row's last tokens). Made once per phrase table (``DynamicVocabLM`` keeps it until the table changes): 2,048
    phrases take a few milliseconds."""

    def __init__(self, n: int, phrase_token_ids: list[tuple[int, ...]]) -> None:
        self.n, self.token_ids = n, [tuple(ids) for ids in phrase_token_ids]
        self.inside: dict[tuple[int, ...], list[int]] = {}
        self.starting: dict[tuple[int, ...], list[int]] = {}
        for phrase, ids in enumerate(self.token_ids):
            for gram in {ids[i : i + n] for i in range(len(ids) - n + 1)}:
                self.inside.setdefault(gram, []).append(phrase)
            for length in range(1, min(n - 1, len(ids)) + 1):
                self.starting.setdefault(ids[:length], []).append(phrase)


class _NGramRecord:
    """What ``PhraseNoRepeatNGram`` keeps of one row: its ids and tokens, what followed each start of every n-gram
    (the tokens after its first ``0 .. n - 1``), and the phrases that hold one of its n-grams inside them."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.tokens: list[int] = []
        self.followers: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        self.inside_seen: set[int] = set()


class PhraseRepetitionPenalty(LogitsProcessor):
    """``repetition_penalty`` (CTRL's rule) over the tokens phrases spell.

    A token that occurs in the row's text is penalised as usual; a phrase is penalised
    when its whole token sequence already occurs there (its text was already written).
    """

    def __init__(self, penalty: float, vocab_size: int, phrase_token_ids: list[tuple[int, ...]]) -> None:
        if not isinstance(penalty, (int, float)) or penalty <= 0:
            raise ValueError(f"repetition_penalty must be a float > 0, got {penalty!r}")
        self.penalty, self.vocab_size = float(penalty), vocab_size
        self.phrase_lengths = torch.tensor([len(ids) for ids in phrase_token_ids], dtype=torch.long)
        width = int(self.phrase_lengths.max()) if phrase_token_ids else 1
        padded = [tuple(ids) + (-1,) * (width - len(ids)) for ids in phrase_token_ids]  # right-padded with -1
        self.phrase_tokens = torch.tensor(padded, dtype=torch.long).reshape(len(phrase_token_ids), width)
        self._table = expansion_table(phrase_token_ids or [(0,)], torch.device("cpu"))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        hit = torch.zeros(scores.shape, dtype=torch.bool)
        for row, ids in enumerate(input_ids):
            tokens = self.tokens_of(ids)
            hit[row, tokens[tokens < self.vocab_size]] = True
            for length in self.phrase_lengths.unique().tolist():
                if len(tokens) < length:
                    continue
                chosen = (self.phrase_lengths == length).nonzero().flatten()
                seen = self.hash(tokens.unfold(0, length, 1))
                found = torch.isin(self.hash(self.phrase_tokens[chosen, :length]), seen)
                hit[row, self.vocab_size + chosen[found]] = True
        hit = hit.to(scores.device)
        penalised = torch.where(scores > 0, scores / self.penalty, scores * self.penalty)
        return torch.where(hit, penalised, scores)

    def tokens_of(self, ids: torch.Tensor) -> torch.Tensor:
        """One row's mixed ids ``(L,)`` -> the LM tokens they spell ``(L',)``."""
        ids = ids.cpu()
        is_phrase = ids >= self.vocab_size
        if not bool(is_phrase.any()):
            return ids
        table, lengths = self._table
        counts = torch.where(is_phrase, lengths[(ids - self.vocab_size).clamp(min=0)], torch.ones_like(ids))
        rows = torch.repeat_interleave(torch.arange(len(ids)), counts)
        offset = torch.arange(len(rows)) - (torch.cumsum(counts, 0) - counts)[rows]
        phrase = (ids[rows] - self.vocab_size).clamp(min=0)
        spelled = table[phrase, (table.shape[1] - lengths[phrase] + offset).clamp(max=table.shape[1] - 1)]
        return torch.where(is_phrase[rows], spelled, ids[rows])

    def hash(self, windows: torch.Tensor) -> torch.Tensor:
        """``(..., n)`` token windows -> ``(...)`` int64 hashes."""
        weights = self.vocab_size ** torch.arange(windows.shape[-1] - 1, -1, -1, dtype=torch.long)
        return (windows * weights).sum(-1)


def check_no_repeat_scope(scope: object) -> None:
    """Refuse a ``no_repeat_ngram_scope`` other than ``NO_REPEAT_SCOPES``, naming the choices."""
    if scope not in NO_REPEAT_SCOPES:
        raise ValueError(
            f"no_repeat_ngram_scope={scope!r}; choose 'all' (the prompt's n-grams count too, transformers' rule) or "
            "'new' (only the n-grams generate writes count, so the text may copy the prompt)"
        )
