"""A phrase competes only where the LM is in the state it was in before the phrase in a document: state keys.

Each place a plugged phrase starts in a retrieved document gives it a *key*: the frozen LM's last (normed) hidden
state just before it there, the state that predicted the phrase's first token. While decoding, a phrase may compete
at a position only where the cosine of the LM's state there and one of its keys reaches a threshold. It is the
evidence kNN-LM and CoG use (a phrase represented by its context in the document), here as a gate in front of the
phrase head; it needs no training. On held-out licences, teacher-forced, a phrase proposed at cosine >= 0.97 was
right 92% of the time, where the LM's own top token was right 47% of the time; on Wikipedia leads, whose documents
seldom hold the text, the same threshold seldom opens (``results/calibration/states/``).

    keys = state_keys(model.lm, document_ids, model.phrase_table.token_ids, threshold=0.97)
    model.generate(ids, phrase_state_keys=keys, phrase_bias=16, ...)

The keys cost one LM pass over the documents' tokens; a ``dynvocab.states.store.DocumentStates`` passed instead of
the LM keeps each document's states, so a document retrieved again is not read again (the pipeline keeps one), and
reads them from a store beside the index when there is one (``dynvocab document-states``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..decoding.context_gate import phrase_starts
from ..phrases.table import PhraseTable
from .store import DocumentStates

__all__ = ["StateGatedScorer", "StateKeys", "row_state_keys", "state_keys"]


@dataclass
class StateKeys:
    """Keys of phrase occurrences and the cosine a phrase needs to compete.

    ``keys`` ``(n, d)`` unit vectors; ``phrases`` ``(n,)`` the phrase-table index of each key's phrase; ``rows``
    ``(n,)`` the batch row whose documents gave the key, or None for keys every row may use; ``num_rows`` the rows of
    that batch.
    """

    keys: torch.Tensor
    phrases: torch.Tensor
    threshold: float
    rows: torch.Tensor | None = None
    num_rows: int = 1

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold={self.threshold} is a cosine: pass a value in [-1, 1] (e.g. 0.97)")
        n = self.keys.shape[0]
        if self.keys.dim() != 2 or self.phrases.shape != (n,) or (self.rows is not None and self.rows.shape != (n,)):
            raise ValueError(f"keys {tuple(self.keys.shape)}, phrases {tuple(self.phrases.shape)} and rows "
                             f"{None if self.rows is None else tuple(self.rows.shape)} must be (n, d), (n,) and (n,)")
        if self.rows is not None and n and not 0 <= int(self.rows.min()) <= int(self.rows.max()) < self.num_rows:
            raise ValueError(f"rows must be 0..{self.num_rows - 1} for num_rows={self.num_rows}; pass the batch's size")

    def to(self, device: torch.device | str) -> StateKeys:
        """These keys on ``device``: themselves when they are there (with the grouping ``open`` made), else a copy."""
        if self.keys.device == torch.device(device):
            return self
        rows = None if self.rows is None else self.rows.to(device)
        return StateKeys(self.keys.to(device), self.phrases.to(device), self.threshold, rows, self.num_rows)

    def for_row(self, row: int) -> StateKeys:
        """The keys row ``row`` may use, for a batch of that row alone (``generate_verified`` decodes one row)."""
        if self.rows is None:
            return self
        mine = self.rows == row
        return StateKeys(self.keys[mine], self.phrases[mine], self.threshold)

    def open(self, hidden: torch.Tensor, num_phrases: int) -> torch.Tensor:
        """``(B, T, d)`` states -> ``(B, T, P)`` bool: which phrases may compete at each position.

        ``B`` may be the batch the keys' rows were made for, repeated by ``generate`` for beams or several
        returned sequences (each row's copies next to each other). Each row's states meet its own keys only.
        """
        batch, steps, width = hidden.shape
        rows = self.num_rows if self.rows is not None else 1
        if batch % rows:
            raise ValueError(f"the keys were made for {rows} rows but the batch has {batch}; pass the keys of each row "
                             "of this batch")
        keys, phrases, real = self._by_row(hidden.device)  # (R, m, d), (R, m), (R, m)
        copies = batch // rows  # beams or returned sequences of a row; 1 in plain decoding, with no copy to make
        states = F.normalize(hidden.float(), dim=-1).reshape(rows, copies * steps, width)
        cosines = torch.bmm(states, keys.transpose(1, 2)).masked_fill(~real[:, None, :], -2.0)
        index = (phrases.repeat_interleave(copies, dim=0) if copies > 1 else phrases)[:, None, :].expand(-1, steps, -1)
        best = hidden.new_full((batch, steps, num_phrases), -2.0, dtype=torch.float32)
        best.scatter_reduce_(-1, index, cosines.view(batch, steps, -1), reduce="amax")
        return best >= self.threshold

    def _by_row(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The keys grouped by row, made once: ``(R, m, d)`` keys, ``(R, m)`` phrases and ``(R, m)`` bool, true for
        a real key (``m``: the most keys a row has; the rest pad)."""
        cached = self.__dict__.get("_grouped")
        if cached is not None and cached[0].device == device:
            return cached
        n, rows = self.keys.shape[0], self.num_rows if self.rows is not None else 1
        owner = (self.rows if self.rows is not None else torch.zeros(n, dtype=torch.long)).to(device)
        counts = torch.bincount(owner, minlength=rows)
        order = torch.argsort(owner, stable=True)
        owner = owner[order]
        slot = torch.arange(n, device=device) - (torch.cumsum(counts, 0) - counts)[owner]
        most = max(int(counts.max()) if n else 0, 1)
        keys = torch.zeros(rows, most, self.keys.shape[1], device=device)
        phrases = torch.zeros(rows, most, dtype=torch.long, device=device)
        real = torch.zeros(rows, most, dtype=torch.bool, device=device)
        keys[owner, slot] = self.keys.to(device, torch.float32)[order]
        phrases[owner, slot] = self.phrases.to(device)[order]
        real[owner, slot] = True
        self.__dict__["_grouped"] = keys, phrases, real
        return keys, phrases, real


class StateGatedScorer(nn.Module):
    """``scorer``'s phrase scores, ``-inf`` where ``keys`` do not open the phrase (``generate``'s
    ``phrase_state_keys``)."""

    def __init__(self, scorer: nn.Module, keys: StateKeys) -> None:
        super().__init__()
        self.scorer, self.keys = scorer, keys

    def forward(self, hidden: torch.Tensor, phrase_vectors: torch.Tensor,
                phrase_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, T, d)``, ``(P, d)``, optional ``(B, P)`` mask -> ``(B, T, P)`` scores."""
        scores = self.scorer(hidden, phrase_vectors, phrase_mask)
        return scores.masked_fill(~self.keys.open(hidden, phrase_vectors.shape[0]), float("-inf"))


def state_keys(
    states: DocumentStates | nn.Module,
    documents: Sequence[Sequence[int]],
    phrase_token_ids: Sequence[tuple[int, ...]],
    threshold: float,
    rows: Sequence[int] | None = None,
    allowed: Sequence[set[int] | None] | None = None,
    num_rows: int | None = None,
    first_key: Sequence[int] | None = None,
) -> StateKeys:
    """Keys of every place a phrase of the table starts in ``documents`` (token ids), past their first token: the
    LM's last normed state just before it.

    ``states`` is a :class:`DocumentStates` (kept across calls), or the LM itself (read once for this call).
    ``rows[i]`` is the batch row document ``i`` was retrieved for (None: keys for every row) in a batch of
    ``num_rows`` (default: the largest row + 1); ``allowed[r]``, the phrase-table indices that row ``r`` uses (None:
    all); ``first_key[i]``, the first position of document ``i`` that gives keys (the tokens before it only
    condition the states: a prompt's instructions and worked example; default 0).
    """
    if rows is not None and len(rows) != len(documents):
        raise ValueError(f"rows has {len(rows)} entries for {len(documents)} documents; give one row per document")
    if first_key is not None and len(first_key) != len(documents):
        raise ValueError(f"first_key has {len(first_key)} entries for {len(documents)} documents; give one each")
    read = states if isinstance(states, DocumentStates) else DocumentStates(states, max_bytes=0)
    index = {tuple(tokens): phrase for phrase, tokens in enumerate(phrase_token_ids)}
    numbers = [number for number, ids in enumerate(documents) if len(ids) > 1]  # one token: no phrase past it
    texts = [documents[number][: read.max_tokens] for number in numbers]
    per_document = read(texts)
    keys, phrases, key_rows = [], [], []
    for offset, position, span in phrase_starts(texts, index):
        row = rows[numbers[offset]] if rows is not None else None
        usable = allowed[row] if allowed is not None and row is not None else None
        start = max(first_key[numbers[offset]], 1) if first_key is not None else 1  # token 0 has no state before it
        if position >= start and (usable is None or index[span] in usable):
            keys.append(per_document[offset][position - 1])
            phrases.append(index[span])
            key_rows.append(row)
    lm = read.lm
    device, width = next(lm.parameters()).device, lm.get_output_embeddings().weight.shape[1]
    stacked = F.normalize(torch.stack(keys), dim=-1) if keys else torch.zeros(0, width, device=device)
    return StateKeys(
        stacked, torch.tensor(phrases, dtype=torch.long, device=device), float(threshold),
        None if rows is None else torch.tensor(key_rows, dtype=torch.long, device=device),
        (num_rows or max(rows, default=0) + 1) if rows is not None else 1,
    )


def row_state_keys(
    states: DocumentStates | nn.Module,
    table: PhraseTable,
    documents: Sequence[Sequence[Sequence[int]]],
    phrases: Sequence[Sequence[str]],
    threshold: float,
    first_key: Sequence[Sequence[int]] | None = None,
) -> StateKeys:
    """The keys of each batch row's phrases in that row's own documents: ``documents[r]`` the token ids of row
    ``r``'s documents, ``phrases[r]`` the texts of its phrases, already set on ``table`` (the model's phrase table);
    ``first_key[r]``, as ``documents[r]``, each document's first position that gives keys (``state_keys``)."""
    if len(documents) != len(phrases) or (first_key is not None and len(first_key) != len(documents)):
        raise ValueError(f"{len(documents)} rows of documents, {len(phrases)} of phrases and "
                         f"{'no' if first_key is None else len(first_key)} of first_key; give each per batch row")
    position = {tokens: i for i, tokens in enumerate(table.token_ids)}
    allowed = [{position[tokens] for tokens in table.tokenize(list(texts)) if tokens in position} for texts in phrases]
    rows = [row for row, found in enumerate(documents) for _ in found]
    starts = None if first_key is None else [start for found in first_key for start in found]
    return state_keys(states, [ids for found in documents for ids in found], table.token_ids, threshold, rows=rows,
                      allowed=allowed, num_rows=len(documents), first_key=starts)
