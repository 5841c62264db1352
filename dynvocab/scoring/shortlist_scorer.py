"""``ShortlistScorer``: the shortlist head as ``DynamicVocabLM.scorer``, kept in step with a changing phrase table.

    model.scorer = ShortlistScorer(model.phrase_table)

Each position's hidden state is its own query ``x0``. A table smaller than
``config.exact_below`` is scored exactly (``DotProductScorer``); a larger one fits the
training-free head on first use, and later ``add_phrases``/``remove_phrases``/``set_phrases``
move phrases in and out of its clusters without a new k-means.

By default the phrases are clustered inside their first token (about 64 per cluster, members
only) and a query probes 96 clusters: a hidden state's best phrases mostly start with its best
tokens, and clusters of the whole table mix first tokens (``results/shortlist/first-benchmark/``).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from ..phrases.table import PhraseTable
from .dot_product import DotProductScorer
from .shortlist_head import ShortlistConfig, ShortlistHead, scattered

__all__ = ["ShortlistScorer"]

logger = logging.getLogger(__name__)

#: query rows scored together: bounds the gathered candidate vectors to rows x C x d
ROWS_PER_CHUNK = 16
#: the scorer's defaults, chosen on SmolLM2 hidden states (results/shortlist/first-benchmark/): clusters of ~64 phrases
#: inside each first token, members only, 96 probed
SCORER_DEFAULTS = {"probe": 96, "subset_size": 0, "cluster_size": 64}


class ShortlistScorer(nn.Module):
    """Scores ``h · e_out(p)`` for the phrases on each position's shortlist, ``-inf`` for the rest.

    ``group_by_first_token=False`` clusters the whole table at once (k-means over every vector).
    """

    def __init__(self, table: PhraseTable, config: ShortlistConfig | None = None, head: ShortlistHead | None = None,
                 group_by_first_token: bool = True) -> None:
        super().__init__()
        if not isinstance(table, PhraseTable):
            raise TypeError(f"table must be the model's PhraseTable (model.phrase_table), got {type(table).__name__}")
        if config is not None and not isinstance(config, ShortlistConfig):
            raise TypeError(f"config must be a ShortlistConfig, got {type(config).__name__}")
        self.table = table
        self.config = config or (head.config if head is not None else ShortlistConfig(**SCORER_DEFAULTS))
        self.group_by_first_token = group_by_first_token
        self.head = head
        self.exact = DotProductScorer()
        table.listeners.add(self)

    # the phrase table's listener interface
    def phrases_kept(self, indices) -> None:
        if self.head is not None:
            self.head.keep([i for i in indices if i < self.head.vocab_size])

    def vectors_forgotten(self) -> None:
        self.head = None

    @torch.no_grad()
    def fit(self, vectors: torch.Tensor) -> ShortlistHead:
        """Fit the training-free head on the table's ``(P, d)`` output vectors now (``forward`` does it on first use)."""
        logger.info("fitting the shortlist head on %d phrase vectors", vectors.shape[0])
        groups = self._first_tokens(0, vectors.shape[0]) if self.group_by_first_token else None
        self.head = ShortlistHead.from_vectors(vectors, self.config, groups)
        return self.head

    def _first_tokens(self, start: int, stop: int) -> torch.Tensor:
        """``(stop - start,)`` the first token id of table phrases ``start .. stop - 1``."""
        return torch.tensor([ids[0] for ids in self.table.token_ids[start:stop]], dtype=torch.long)

    def _synced_head(self, vectors: torch.Tensor) -> ShortlistHead:
        if self.head is None:
            return self.fit(vectors)
        known = self.head.vocab_size
        if known < vectors.shape[0]:
            self.head.add(vectors[known:], self._first_tokens(known, vectors.shape[0]) if self.head.grouped else None)
        return self.head

    def forward(
        self, hidden: torch.Tensor, phrase_vectors: torch.Tensor, phrase_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``(B, T, d)`` hidden states, ``(P, d)`` vectors, optional ``(B, P)`` bool mask -> ``(B, T, P)``.

        Vectors that are not the table's (training passes each batch's own) are scored exactly.
        """
        found = self.sparse(hidden, phrase_vectors)
        if found is None:
            return self.exact(hidden, phrase_vectors, phrase_mask)
        dense = scattered(*found, phrase_vectors.shape[0])
        if phrase_mask is not None:
            dense = dense.masked_fill(~phrase_mask[:, None, :], float("-inf"))
        return dense

    def sparse(self, hidden: torch.Tensor, phrase_vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each position's shortlist: ``(B, T, d)`` states and the table's ``(P, d)`` vectors -> ids ``(B, T, C)``
        (``P`` pads a row) and their exact scores ``(B, T, C)`` (``-inf`` at the pads); None where ``forward``
        scores exactly (a table below ``exact_below``, vectors that are not the table's).

        ``DynamicVocabLM`` writes these into its logits over ``V + P``, so a decoding step over a million phrases
        fills one logits tensor instead of building the phrases' and copying them beside the LM's.
        """
        if phrase_vectors.shape[0] < self.config.exact_below or phrase_vectors.shape[0] != len(self.table):
            return None
        head = self._synced_head(phrase_vectors)
        batch, steps, dim = hidden.shape
        parts = [head.score(rows, phrase_vectors) for rows in hidden.reshape(batch * steps, dim).split(ROWS_PER_CHUNK)]
        if len(parts) == 1:  # a decoding step
            ids, scores = parts[0][0], parts[0][1][:, 0]
        else:  # chunks of different widths, padded to the widest
            width = max(part_ids.shape[1] for part_ids, _ in parts)
            ids = torch.cat([F.pad(i, (0, width - i.shape[1]), value=head.vocab_size) for i, _ in parts])
            scores = torch.cat([F.pad(s[:, 0], (0, width - s.shape[2]), value=float("-inf")) for _, s in parts])
        return ids.view(batch, steps, -1), scores.view(batch, steps, -1)
