"""Repetition control that sees a phrase as the tokens it stands for.

``transformers``' own ``no_repeat_ngram_size`` and ``repetition_penalty`` compare ids,
so a phrase id never matches the tokens it spells and a phrase can loop freely. These
logits processors expand every row's mixed ids into LM tokens first; ``generate``
of ``DynamicVocabLM`` uses them in place of the built-in ones when those arguments
are given.

n-grams are compared through an integer hash ``sum(t_i * V**(n-1-i))``; it is exact
while ``V**n < 2**63`` (GPT-2 and SmolLM2 vocabularies up to n = 4) and a wrapping
hash beyond that, where a spurious match is possible but vanishingly rare.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from .readback import expansion_table

__all__ = ["NO_REPEAT_SCOPES", "PhraseMaxUses", "PhraseNoRepeatNGram", "PhraseRepetitionPenalty", "check_no_repeat_scope"]


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


class _PhraseAware(LogitsProcessor):
    """Shared state: the vocabulary size and every phrase's tokens (right-aligned, padded with -1)."""

    def __init__(self, vocab_size: int, phrase_token_ids: list[tuple[int, ...]]) -> None:
        self.vocab_size = vocab_size
        self.phrase_lengths = torch.tensor([len(ids) for ids in phrase_token_ids], dtype=torch.long)
        width = int(self.phrase_lengths.max()) if phrase_token_ids else 1
        padded = [tuple(ids) + (-1,) * (width - len(ids)) for ids in phrase_token_ids]
        self.phrase_tokens = torch.tensor(padded, dtype=torch.long).reshape(len(phrase_token_ids), width)
        self._table = expansion_table(phrase_token_ids or [(0,)], torch.device("cpu"))

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


#: what ``PhraseNoRepeatNGram`` counts as already written
NO_REPEAT_SCOPES = ("all", "new")


class PhraseNoRepeatNGram(_PhraseAware):
    """``no_repeat_ngram_size`` over the tokens phrases spell: no id may complete an n-gram the row already has.

    A token is banned as usual; a phrase is banned when any n-gram that its tokens would
    end (with the row's last ``n - 1`` tokens before it) is already in the row.
    ``scope="all"`` counts the prompt's n-grams too (``transformers``' rule); ``scope="new"``
    counts only what this ``generate`` call writes (the columns after those of its first
    call), so an answer may copy its documents from the prompt but never repeat itself.
    """

    def __init__(self, ngram_size: int, vocab_size: int, phrase_token_ids: list[tuple[int, ...]], scope: str = "all") -> None:
        if not isinstance(ngram_size, int) or ngram_size < 1:
            raise ValueError(f"no_repeat_ngram_size must be a positive int, got {ngram_size!r}")
        check_no_repeat_scope(scope)
        super().__init__(vocab_size, phrase_token_ids)
        self.n, self.scope = ngram_size, scope
        self._prompt_width: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._prompt_width is None:
            self._prompt_width = input_ids.shape[1] if self.scope == "new" else 0
        banned = torch.zeros(scores.shape, dtype=torch.bool)
        for row, ids in enumerate(input_ids[:, self._prompt_width :]):
            tokens = self.tokens_of(ids)
            if len(tokens) + 1 < self.n:
                continue
            seen = self.hash(tokens.unfold(0, self.n, 1)) if len(tokens) >= self.n else tokens[:0]
            banned[row, : self.vocab_size] = self._banned_tokens(tokens)
            if len(self.phrase_lengths) and len(seen):
                banned[row, self.vocab_size : self.vocab_size + len(self.phrase_lengths)] = self._banned_phrases(tokens, seen)
        return scores.masked_fill(banned.to(scores.device), float("-inf"))

    def _banned_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        banned = torch.zeros(self.vocab_size, dtype=torch.bool)
        if self.n == 1:
            banned[tokens[tokens < self.vocab_size]] = True
            return banned
        if len(tokens) < self.n:
            return banned
        windows = tokens.unfold(0, self.n, 1)
        context = tokens[len(tokens) - self.n + 1 :]
        hits = windows[(windows[:, :-1] == context).all(1), -1]
        banned[hits[hits < self.vocab_size]] = True
        return banned

    def _banned_phrases(self, tokens: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        context = tokens[max(0, len(tokens) - self.n + 1) :]
        spelled = torch.cat([context.expand(len(self.phrase_tokens), -1), self.phrase_tokens], dim=1)
        if spelled.shape[1] < self.n:
            return torch.zeros(len(self.phrase_tokens), dtype=torch.bool)
        windows = spelled.unfold(1, self.n, 1)  # (P, windows, n); window i ends at phrase token i + n - 1 - |context|
        ends = torch.arange(windows.shape[1]) + self.n - 1 - len(context)
        real = ends[None, :] < self.phrase_lengths[:, None]
        return (_contains(torch.sort(seen).values, self.hash(windows.clamp(min=0))) & real).any(1)


class PhraseRepetitionPenalty(_PhraseAware):
    """``repetition_penalty`` (CTRL's rule) over the tokens phrases spell.

    A token that occurs in the row's text is penalised as usual; a phrase is penalised
    when its whole token sequence already occurs there (its text was already written).
    """

    def __init__(self, penalty: float, vocab_size: int, phrase_token_ids: list[tuple[int, ...]]) -> None:
        if not isinstance(penalty, (int, float)) or penalty <= 0:
            raise ValueError(f"repetition_penalty must be a float > 0, got {penalty!r}")
        super().__init__(vocab_size, phrase_token_ids)
        self.penalty = float(penalty)

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


def check_no_repeat_scope(scope: object) -> None:
    """Refuse a ``no_repeat_ngram_scope`` other than ``NO_REPEAT_SCOPES``, naming the choices."""
    if scope not in NO_REPEAT_SCOPES:
        raise ValueError(
            f"no_repeat_ngram_scope={scope!r}; choose 'all' (the prompt's n-grams count too, transformers' rule) or "
            "'new' (only the n-grams generate writes count, so the text may copy the prompt)"
        )


def _contains(sorted_seen: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` (any shape) found in the non-empty sorted ``(S,)`` ``sorted_seen``: a binary search per value, which
    beats ``torch.isin``'s sort of both when the seen n-grams are few and the phrase windows many (3x at 16k windows)."""
    position = torch.searchsorted(sorted_seen, values).clamp(max=len(sorted_seen) - 1)
    return sorted_seen[position] == values

