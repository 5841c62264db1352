"""How phrase scores meet the LM's token scores at selection time.

The logits of one step hold the LM's own token scores next to the phrase scores, so
the LM's view of a phrase's first token costs nothing. ``PhraseAgreement`` keeps a
phrase only when its first token is among the LM's ``top_k`` tokens at that step (a
relaxed acceptance rule in the spirit of NEST's span verification, Li et al. 2024);
the LM's tokens are left as they are. ``generate(..., phrase_agreement_top_k=k)`` on a
``DynamicVocabLM`` adds it.

``FirstTokenMass`` goes further: it keeps the LM's own probability of every next token
and lets the phrases that start with a token share only that token's mass, split with
the token itself by their joint scores. The text's next-token distribution is then the
LM's exactly; phrases only choose how a continuation the LM already wants goes on.
``generate(..., phrase_first_token_mass=True)`` adds it (meant for sampling, where an
over-scored phrase is otherwise drawn far more often than the LM would write its text).

``PhraseBias`` shifts every phrase score by a constant for one ``generate`` call
(``phrase_bias=b``), the decoding-time twin of ``DynamicVocabConfig.phrase_score_bias``.
Under ``FirstTokenMass`` it no longer changes how often a continuation starts, only the
odds of going on as a phrase rather than as the bare first token.
"""

from __future__ import annotations

import math

import torch
from transformers import LogitsProcessor

__all__ = ["FirstTokenMass", "PhraseAgreement", "PhraseBias"]


class PhraseBias(LogitsProcessor):
    """Adds ``bias`` to every phrase score (columns ``>= vocab_size``); a ``-inf`` stays ``-inf``."""

    def __init__(self, bias: float, vocab_size: int) -> None:
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ValueError(f"phrase_bias must be a finite number, got {bias!r}")
        self.bias, self.vocab_size = float(bias), vocab_size

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """``(B, L)`` ids, ``(B, V + P)`` scores -> the same scores, phrases shifted by ``bias``."""
        return torch.cat([scores[:, : self.vocab_size], scores[:, self.vocab_size :] + self.bias], dim=1)


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
        if self.first_tokens.device != scores.device:  # moved once, not copied to the device at every step
            self.first_tokens = self.first_tokens.to(scores.device)
        agrees = allowed[:, self.first_tokens]
        phrase_scores = scores[:, self.vocab_size : self.vocab_size + phrases].masked_fill(~agrees, float("-inf"))
        return torch.cat([scores[:, : self.vocab_size], phrase_scores, scores[:, self.vocab_size + phrases :]], dim=1)


class FirstTokenMass(LogitsProcessor):
    """Rescales token and phrase scores so that everything starting with token ``t`` has the LM's ``p(t)``.

    Within the group of token ``t`` and the phrases whose first token is ``t``, each member
    gets ``log p_LM(t) + score - logsumexp(group scores)``; a token no phrase starts with
    keeps ``log p_LM(t)``. The result is a normalised log-distribution over tokens and phrases.

    Args:
        vocab_size: ``V``; columns ``>= V`` of the scores are phrases.
        phrase_token_ids: every phrase's tokens, in table order.
    """

    def __init__(self, vocab_size: int, phrase_token_ids: list[tuple[int, ...]]) -> None:
        self.vocab_size = vocab_size
        self.first_tokens = torch.tensor([ids[0] for ids in phrase_token_ids], dtype=torch.long)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """``(B, L)`` ids, ``(B, V + P)`` scores -> ``(B, V + P)`` log-probabilities."""
        phrases, vocab = self.first_tokens.numel(), self.vocab_size
        if not phrases:
            return scores
        tokens, phrase_scores = scores[:, :vocab].float(), scores[:, vocab : vocab + phrases].float()
        first = self.first_tokens.to(scores.device).expand(scores.shape[0], -1)
        group_max = tokens.scatter_reduce(1, first, phrase_scores, reduce="amax")
        group_max = group_max.masked_fill(torch.isinf(group_max), 0.0)  # a group that is all -inf stays -inf below
        mass = (tokens - group_max).exp().scatter_add(1, first, (phrase_scores - group_max.gather(1, first)).exp())
        group_lse = group_max + mass.log()
        shift = tokens.log_softmax(-1) - group_lse  # (B, V): log p_LM(t) - logsumexp(group of t)
        out = torch.cat([tokens + shift, phrase_scores + shift.gather(1, first)], dim=1)
        out = out.masked_fill(out.isnan(), float("-inf"))  # -inf - -inf: a group with no mass at all
        return torch.cat([out.to(scores.dtype), scores[:, vocab + phrases :]], dim=1)
