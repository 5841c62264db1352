"""The training objective L = L_p + L_t + L_kl of the dynamic-vocabulary paper."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model import DynamicVocabLM
from ..tokens.padding import pad_sequences
from .collate import MixedBatch
from .negatives import prefix_groups

__all__ = [
    "LossWeights",
    "aligned_kl",
    "dynamic_vocab_loss",
    "encode_phrase_set",
    "next_item_loss",
    "term_counts",
    "weighted_total",
]


@dataclass(frozen=True)
class LossWeights:
    phrase: float = 1.0
    token: float = 1.0
    kl: float = 1.0
    distill: float = 0.0  # token read-back only: phrase scores toward the LM's own log-probability of the phrase


def encode_phrase_set(model: DynamicVocabLM, phrases: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable input and output vectors ``(P, d)`` of ``phrases``.

    Phrases that are prefixes of others share one encoder pass over the longest
    string (the causal trick): prefix and successor negatives cost no extra pass.
    """
    packed = prefix_groups(phrases)
    device = model.lm.get_input_embeddings().weight.device
    ids, mask = pad_sequences([longest for longest, _ in packed.groups], device=device)
    group = torch.tensor(packed.group_of, device=device)
    last = torch.tensor(packed.length_of, device=device) - 1
    return model.phrase_encoder.encode_prefixes(ids, mask, group, last)  # the head runs at the P phrase ends only


def next_item_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean next-id cross-entropy. ``(B, T, N)`` logits, ``(B, T)`` ids and mask."""
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def aligned_kl(
    mixed_logits: torch.Tensor, token_logits: torch.Tensor, batch: MixedBatch, vocab_size: int
) -> torch.Tensor:
    """KL(token view || mixed view) of next-token distributions at aligned positions.

    Mixed position ``i`` is compared with token position ``sigma[i]`` (a phrase with
    its last token), both predicting what follows; the mixed view is restricted to the
    ``V`` token columns and renormalised. The token view is the target (no gradient).
    Positions whose item is the last of its row have no next item and are skipped.
    """
    lengths = batch.mixed_mask.sum(1, keepdim=True)
    positions = torch.arange(batch.mixed_ids.shape[1], device=lengths.device)
    valid = positions.unsqueeze(0) < lengths - 1
    rows = torch.arange(batch.sigma.shape[0], device=lengths.device).unsqueeze(1).expand_as(batch.sigma)
    target = token_logits[rows[valid], batch.sigma[valid]].detach().float().log_softmax(-1)
    predicted = mixed_logits[valid][:, :vocab_size].float().log_softmax(-1)
    return F.kl_div(predicted, target, log_target=True, reduction="batchmean")


def dynamic_vocab_loss(
    model: DynamicVocabLM, batch: MixedBatch, weights: LossWeights = LossWeights(), train_lm: bool = True
) -> dict[str, torch.Tensor]:
    """``{"loss", "phrase", "token", "kl"}`` for one batch.

    L_p is the LM loss over ``V + P`` on the mixed sequence; L_t the plain token LM
    loss on the same text; L_kl aligns their next-token distributions. With
    ``train_lm=False`` (a frozen LM) the token view runs without gradients and L_t is
    reported but adds nothing to the loss.
    """
    vectors = encode_phrase_set(model, batch.phrases)
    mixed = model(
        input_ids=batch.mixed_ids, attention_mask=batch.mixed_mask, phrase_vectors=vectors, phrase_mask=batch.phrase_mask
    ).logits
    with torch.set_grad_enabled(train_lm and torch.is_grad_enabled()):
        token_logits = model.lm(input_ids=batch.token_ids, attention_mask=batch.token_mask).logits
    terms = {
        "phrase": next_item_loss(mixed, batch.mixed_ids, batch.mixed_mask),
        "token": next_item_loss(token_logits, batch.token_ids, batch.token_mask),
        "kl": aligned_kl(mixed, token_logits, batch, model.vocab_size),
    }
    terms["loss"] = weighted_total(terms, weights, train_lm)
    return terms


def weighted_total(terms: dict[str, torch.Tensor], weights: LossWeights, train_lm: bool) -> torch.Tensor:
    """L_p + L_t + L_kl with their weights; L_t only when the LM trains, L_kl where the objective has one."""
    token_term = weights.token * terms["token"] if train_lm else 0.0
    kl_term = weights.kl * terms["kl"] if "kl" in terms else 0.0
    distill_term = weights.distill * terms["distill"] if "distill" in terms else 0.0
    return weights.phrase * terms["phrase"] + token_term + kl_term + distill_term


def term_counts(batch: MixedBatch) -> dict[str, torch.Tensor]:
    """How many positions each term of ``dynamic_vocab_loss`` averages over (every item that has a next one)."""
    mixed = batch.mixed_mask[:, 1:].sum()
    return {"phrase": mixed, "token": batch.token_mask[:, 1:].sum(), "kl": mixed}
