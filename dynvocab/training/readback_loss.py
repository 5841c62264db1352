"""The objective matched to token read-back: the next item is scored on the LM's state over the plain text.

Under ``readback="tokens"`` an emitted phrase is fed back as its tokens, so the item after
mixed position ``i`` is scored from the LM's state over the plain text at token position
``sigma[i]`` (the item's last token), never from a state that read a phrase vector. Only
three things of that position enter L_p over ``V + P``: the hidden state ``h``, the
log-sum-exp of the LM's ``V`` logits and the logit of the token that follows::

    log Z = logaddexp(lse_V(h), logsumexp_p(h . e_out(p)))
    L_p   = mean_i [log Z_i - target logit_i]    (the next token's logit, or h . e_out(gold phrase))

With a frozen LM all three are fixed, so ``dynvocab.training.state_cache`` stores them and
a step runs only the phrase encoder (:func:`cached_readback_loss`). When the LM trains
(LoRA or full), :func:`token_readback_loss` runs it over the token view and adds L_t.
L_kl vanishes under this read-back: restricted to ``V`` the mixed view's distribution is
the LM's own at the same state.

A phrase that spells the text right after a position is no mistake there under token
read-back (it reads back as the very tokens), so by default it leaves that position's
softmax instead of counting as a negative (``spelling_negatives=False``); the gold item
and the next token stay. Elsewhere it is a negative like any other.

The same cache gives, for every phrase that spells the text at a position, the LM's own
log-probability of its tokens there (:func:`lm_phrase_logprob`). ``weights.distill`` pulls the
phrase's score toward ``lse_V + log P_LM(phrase)``, the logit it would have as one more
item of the LM's own distribution: a score that says how likely the LM itself is to write
the phrase, so that one bias, chosen on held-out text, decides phrase against token.
"""

from __future__ import annotations

import torch

from ..model import DynamicVocabLM
from .collate import MixedBatch
from .loss import LossWeights, encode_phrase_set, next_item_loss

__all__ = ["cached_readback_loss", "lm_phrase_logprob", "readback_positions", "readback_terms", "spelling_mask",
           "token_readback_loss"]


def readback_positions(batch: MixedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every mixed position with a next item: its row ``(n,)``, token position ``sigma`` ``(n,)`` and next id ``(n,)``."""
    lengths = batch.mixed_mask.sum(1, keepdim=True)
    positions = torch.arange(batch.mixed_ids.shape[1], device=lengths.device)
    valid = positions.unsqueeze(0) < lengths - 1
    rows = torch.arange(batch.mixed_ids.shape[0], device=lengths.device).unsqueeze(1).expand_as(valid)
    following = torch.cat([batch.mixed_ids[:, 1:], batch.mixed_ids[:, :1]], dim=1)
    return rows[valid], batch.sigma[valid], following[valid]


def spelling_mask(batch: MixedBatch, rows: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """``(n, P)`` bool: phrase ``p`` spells the tokens right after token position ``sigma`` of row ``rows`` (it fits)."""
    index = {tokens: p for p, tokens in enumerate(batch.phrases)}
    lengths = sorted({len(tokens) for tokens in batch.phrases})
    texts, ends = batch.token_ids.tolist(), batch.token_mask.sum(1).tolist()
    fits = torch.zeros(len(rows), len(batch.phrases), dtype=torch.bool)
    for k, (row, position) in enumerate(zip(rows.tolist(), sigma.tolist())):
        text = texts[row]
        for length in lengths:
            if position + 1 + length > ends[row]:
                break
            phrase = index.get(tuple(text[position + 1 : position + 1 + length]))
            if phrase is not None:
                fits[k, phrase] = True
    return fits.to(rows.device)


def readback_terms(
    model: DynamicVocabLM, batch: MixedBatch, hidden: torch.Tensor, stats: torch.Tensor, spelling_negatives: bool = False
) -> dict[str, torch.Tensor]:
    """``{"phrase", "distill", "phrase_mass", "accuracy", "token_accuracy"}`` from the token view's states.

    ``phrase`` is L_p over ``V + P``. ``distill`` is the squared gap, over every (position,
    phrase) pair where the phrase spells the text, between the phrase's score and what the LM
    itself gives those tokens there: ``lse_V + log P_LM(phrase)`` (a phrase's logit if it
    were one more token of the LM's own distribution).

    Args:
        hidden: ``(B, Tt, d)`` the LM's last hidden states over ``batch.token_ids``.
        stats: ``(B, Tt, 3)`` per position the log-sum-exp of the LM's ``V`` logits, the
            logit of the next token and the largest logit.

    ``phrase_mass`` is the mean probability given to phrases; ``accuracy`` the share of
    positions whose top item over ``V + P`` spells the text (the calibration report's measure),
    ``token_accuracy`` the same with phrases off (the LM's own top token): the floor to beat.
    """
    _, vectors_out = encode_phrase_set(model, batch.phrases)
    rows, sigma, target = readback_positions(batch)
    states = hidden[rows, sigma].to(vectors_out.dtype)  # (n, d)
    lse, following, top = stats[rows, sigma].float().unbind(-1)
    scores = model._calibrated(model.scorer(states[None], vectors_out)[0]).float()
    scores = scores.masked_fill(~batch.phrase_mask[rows], float("-inf"))  # (n, P)
    is_phrase = target >= model.vocab_size
    gold_column = (target - model.vocab_size).clamp(min=0)[:, None]
    gold = torch.where(is_phrase, scores.gather(1, gold_column)[:, 0], following)
    fits = spelling_mask(batch, rows, sigma)
    competing = scores
    if not spelling_negatives:  # a phrase that fits leaves the softmax where it fits, unless it is the gold item
        competing = scores.masked_fill(fits & ~_gold_columns(is_phrase, gold_column, fits), float("-inf"))
    log_z = torch.logaddexp(lse, competing.logsumexp(-1))
    spelled, column = fits.nonzero(as_tuple=True)
    own = lse[spelled] + lm_phrase_logprob(stats, rows[spelled], sigma[spelled], _lengths(batch, column))
    distill = (scores[spelled, column] - own).square().mean() if len(spelled) else scores.new_zeros(())
    phrase_lse = scores.logsumexp(-1).detach()
    best_phrase = scores.max(-1)
    right = torch.where(best_phrase.values > top, fits.gather(1, best_phrase.indices[:, None])[:, 0], following >= top)
    phrase_mass = (phrase_lse - torch.logaddexp(lse, phrase_lse)).exp().mean()
    return {"phrase": (log_z - gold).mean(), "distill": distill, "phrase_mass": phrase_mass,
            "accuracy": right.float().mean(), "token_accuracy": (following >= top).float().mean()}


def lm_phrase_logprob(stats: torch.Tensor, rows: torch.Tensor, sigma: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(n,)`` the LM's log-probability of the ``lengths[i]`` tokens after token position ``sigma[i]`` of row ``rows[i]``
    (sums of the cached next-token log-probabilities, ``stats[..., 1] - stats[..., 0]``)."""
    token_logprob = (stats[..., 1] - stats[..., 0]).float().nan_to_num(0.0)  # NaN at a chunk's last position
    summed = torch.nn.functional.pad(token_logprob.cumsum(-1), (1, 0))  # (B, T + 1): summed[b, t] = sum of the first t
    return summed[rows, sigma + lengths] - summed[rows, sigma]


def _lengths(batch: MixedBatch, columns: torch.Tensor) -> torch.Tensor:
    lengths = torch.tensor([len(p) for p in batch.phrases], device=columns.device)
    return lengths[columns]


def _gold_columns(is_phrase: torch.Tensor, gold_column: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(n, P)`` bool: the gold phrase's column at positions whose target is a phrase."""
    return torch.zeros_like(like).scatter_(1, gold_column, is_phrase[:, None])


def cached_readback_loss(
    model: DynamicVocabLM, batch: MixedBatch, hidden: torch.Tensor, stats: torch.Tensor,
    weights: LossWeights = LossWeights(), spelling_negatives: bool = False,
) -> dict[str, torch.Tensor]:
    """``readback_terms`` plus ``token`` and ``loss`` (L_p and the weighted distillation) for a frozen LM from cached states.

    ``token`` is the frozen LM's own loss on the same text, reported; it trains nothing.
    """
    terms = readback_terms(model, batch, hidden, stats, spelling_negatives)
    following = stats[:, :-1]
    terms["token"] = (following[..., 0] - following[..., 1])[batch.token_mask[:, 1:].bool()].mean()
    terms["loss"] = weights.phrase * terms["phrase"] + weights.distill * terms["distill"]
    return terms


def token_readback_loss(
    model: DynamicVocabLM, batch: MixedBatch, weights: LossWeights = LossWeights(), train_lm: bool = True,
    spelling_negatives: bool = False,
) -> dict[str, torch.Tensor]:
    """The same L_p with the LM run over the token view (with gradients when it trains), plus its L_t."""
    with torch.set_grad_enabled(train_lm and torch.is_grad_enabled()):
        out = model.lm(input_ids=batch.token_ids, attention_mask=batch.token_mask, output_hidden_states=True)
        logits = out.logits.float()
        following = logits[:, :-1].gather(-1, batch.token_ids[:, 1:, None])[..., 0]
        following = torch.cat([following, following[:, :1]], dim=1)  # the last position has no next token: never read
        stats = torch.stack([logits.logsumexp(-1), following, logits.max(-1).values], dim=-1)
    terms = readback_terms(model, batch, out.hidden_states[-1], stats, spelling_negatives)
    terms["token"] = next_item_loss(logits, batch.token_ids, batch.token_mask)
    terms["loss"] = (weights.phrase * terms["phrase"] + weights.distill * terms["distill"]
                     + (weights.token * terms["token"] if train_lm else 0.0))
    return terms
