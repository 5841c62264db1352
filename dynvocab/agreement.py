"""Phrase verification at selection time: a phrase may start only where the LM itself would.

The logits of one step hold the LM's own token scores next to the phrase scores, so
the LM's view of a phrase's first token costs nothing. ``PhraseAgreement`` keeps a
phrase only when its first token is among the LM's ``top_k`` tokens at that step (a
relaxed acceptance rule in the spirit of NEST's span verification, Li et al. 2024);
the LM's tokens are left as they are. ``generate(..., phrase_agreement_top_k=k)`` on a
``DynamicVocabLM`` adds it.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

__all__ = ["PhraseAgreement"]


class PhraseAgreement(LogitsProcessor):
    """Sets a phrase's score to ``-inf`` unless its first token is in the LM's top ``top_k`` tokens.

    Args:
        top_k: how many of the LM's best tokens a phrase may start with (1: only the greedy token).
        vocab_size: ``V``; columns ``>= V`` of the scores are phrases.
        phrase_token_ids: every phrase's tokens, in table order.
    """

    def __init__(self, top_k: int, vocab_size: int, phrase_token_ids: list[tuple[int, ...]]) -> None:
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"phrase_agreement_top_k must be a positive int, got {top_k!r}")
        self.top_k, self.vocab_size = top_k, vocab_size
        self.first_tokens = torch.tensor([ids[0] for ids in phrase_token_ids], dtype=torch.long)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """``(B, L)`` ids, ``(B, V + P)`` scores -> the same scores with disagreeing phrases at ``-inf``."""
        phrases = self.first_tokens.numel()
        if not phrases:
            return scores
        best = scores[:, : self.vocab_size].topk(min(self.top_k, self.vocab_size), dim=-1).indices
        allowed = torch.zeros(scores.shape[0], self.vocab_size, dtype=torch.bool, device=scores.device)
        allowed.scatter_(1, best, True)
        agrees = allowed[:, self.first_tokens.to(scores.device)]
        phrase_scores = scores[:, self.vocab_size : self.vocab_size + phrases].masked_fill(~agrees, float("-inf"))
        return torch.cat([scores[:, : self.vocab_size], phrase_scores, scores[:, self.vocab_size + phrases :]], dim=1)
