"""Calibration of phrase scores against token scores, measured on held-out text.

The model reads a prompt and its reference continuation (teacher forcing, one forward
pass per prompt) with the phrases the pipeline would plug in for that prompt. At each
continuation position it either prefers a phrase or a token. A phrase *fits* there
when its tokens are the next tokens of the reference. Shifting every phrase logit by a
bias ``b`` moves the balance, so one pass scores every bias at once:

- ``win_rate``: share of positions where a phrase has the highest score;
- ``fit_rate``: share of positions where at least one phrase fits (the most a
  perfectly calibrated model could emit as phrases);
- ``precision``: share of phrase wins where the winning phrase fits;
- ``recall``: share of fitting positions where a fitting phrase wins;
- ``accuracy``: share of positions whose top item is right (a fitting phrase, or the
  reference's next token).

A model that over-scores phrases has ``win_rate`` far above ``fit_rate`` and low
``precision``; the bias with the highest ``accuracy`` is the calibrated one on this data.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dynvocab.decoding.context_gate import PhraseContexts, context_size

__all__ = ["CalibrationCounts", "calibration_counts", "context_allowed", "count_positions", "fitting_phrases",
           "next_item_logits"]


class CalibrationCounts:
    """Position counts per bias, summed over prompts; ``table()`` turns them into rates."""

    def __init__(self, biases: Sequence[float]) -> None:
        self.biases = [float(b) for b in biases]
        self.positions = self.fits = 0
        self.wins = [0] * len(self.biases)
        self.fitting_wins = [0] * len(self.biases)
        self.correct = [0] * len(self.biases)

    def add(self, other: CalibrationCounts) -> None:
        if other.biases != self.biases:
            raise ValueError(f"counts over biases {other.biases} cannot be added to counts over {self.biases}")
        self.positions += other.positions
        self.fits += other.fits
        for i in range(len(self.biases)):
            self.wins[i] += other.wins[i]
            self.fitting_wins[i] += other.fitting_wins[i]
            self.correct[i] += other.correct[i]

    def table(self) -> list[dict]:
        """One row per bias: ``bias``, ``win_rate``, ``fit_rate``, ``precision``, ``recall``, ``accuracy``."""
        return [
            {"bias": bias, "win_rate": _rate(wins, self.positions), "fit_rate": _rate(self.fits, self.positions),
             "precision": _rate(fitting, wins), "recall": _rate(fitting, self.fits),
             "accuracy": _rate(correct, self.positions)}
            for bias, wins, fitting, correct in zip(self.biases, self.wins, self.fitting_wins, self.correct)
        ]


def _rate(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0


def fitting_phrases(phrase_tokens: list[tuple[int, ...]], continuation: list[int]) -> torch.Tensor:
    """``(T, P)`` bool: phrase ``p`` spells ``continuation[t : t + len(p)]``."""
    fits = torch.zeros(len(continuation), len(phrase_tokens), dtype=torch.bool)
    starts: dict[int, list[int]] = {}
    for t, token in enumerate(continuation):
        starts.setdefault(token, []).append(t)
    for p, tokens in enumerate(phrase_tokens):
        for t in starts.get(tokens[0], ()):
            if tuple(continuation[t : t + len(tokens)]) == tokens:
                fits[t, p] = True
    return fits


def context_allowed(contexts: PhraseContexts, phrase_tokens: list[tuple[int, ...]], prompt_ids: list[int],
                    continuation_ids: list[int]) -> torch.Tensor:
    """``(T, P)`` bool: at continuation position ``t`` phrase ``p`` passes ``PhraseContextGate`` over ``contexts``
    (the text so far ends with a left context that ``p`` follows in some document)."""
    allowed = torch.zeros(len(continuation_ids), len(phrase_tokens), dtype=torch.bool)
    if not contexts:
        return allowed
    n, index = context_size(contexts), {tokens: p for p, tokens in enumerate(phrase_tokens)}
    text = list(prompt_ids) + list(continuation_ids)
    for t in range(len(continuation_ids)):
        end = len(prompt_ids) + t
        for phrase in contexts.get(tuple(text[max(0, end - n) : end]), ()):
            if phrase in index:
                allowed[t, index[phrase]] = True
    return allowed


@torch.no_grad()
def next_item_logits(model, prompt_ids: list[int], continuation_ids: list[int]) -> torch.Tensor:
    """``(T, V + P)`` float logits of what follows each of the ``T`` continuation positions (one forward pass)."""
    if not prompt_ids or not continuation_ids:
        raise ValueError("calibration needs a non-empty prompt and continuation")
    ids = torch.tensor([prompt_ids + continuation_ids], device=model.device)
    return model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float().cpu()


def calibration_counts(
    model, prompt_ids: list[int], continuation_ids: list[int], biases: Sequence[float], agreement_top_k: int = 0
) -> CalibrationCounts:
    """Counts for one prompt under the phrases currently set on ``model`` (one row).

    ``model`` is a ``DynamicVocabLM`` whose scores already include its configured
    ``phrase_score_scale`` and ``phrase_score_bias``; ``biases`` are added on top. With
    ``agreement_top_k=k`` a phrase competes only where its first token is among the
    LM's top-k tokens, as ``generate(..., phrase_agreement_top_k=k)`` decodes.
    """
    logits = next_item_logits(model, prompt_ids, continuation_ids)
    return count_positions(logits, model.vocab_size, model.phrase_table.token_ids, continuation_ids, biases,
                           agreement_top_k)


def count_positions(
    logits: torch.Tensor, vocab: int, phrase_tokens: list[tuple[int, ...]], continuation_ids: list[int],
    biases: Sequence[float], agreement_top_k: int = 0, allowed: torch.Tensor | None = None,
) -> CalibrationCounts:
    """``calibration_counts`` from ``next_item_logits``: score several settings with one forward pass.

    ``allowed`` ``(T, P)`` bool (``context_allowed``): only these phrases compete at each position.
    """
    fits = fitting_phrases(phrase_tokens, continuation_ids)[:, : logits.shape[1] - vocab]
    best_token = logits[:, :vocab].max(-1)
    gold_token = torch.tensor(continuation_ids)
    counts = CalibrationCounts(biases)
    counts.positions, counts.fits = len(continuation_ids), int(fits.any(-1).sum())
    if fits.shape[1] == 0:  # no phrases: tokens always win
        counts.correct = [int((best_token.indices == gold_token).sum())] * len(biases)
        return counts
    phrase_logits = logits[:, vocab : vocab + fits.shape[1]]
    if allowed is not None:
        phrase_logits = phrase_logits.masked_fill(~allowed[:, : fits.shape[1]], float("-inf"))
    if agreement_top_k:
        first = torch.tensor([tokens[0] for tokens in phrase_tokens[: fits.shape[1]]])
        top = logits[:, :vocab].topk(agreement_top_k, dim=-1).indices  # (T, k)
        agrees = (first[None, :, None] == top[:, None, :]).any(-1)
        phrase_logits = phrase_logits.masked_fill(~agrees, float("-inf"))
    best_phrase = phrase_logits.max(-1)
    phrase_fits = fits.gather(1, best_phrase.indices[:, None])[:, 0]
    token_right = best_token.indices == gold_token
    for i, bias in enumerate(counts.biases):
        wins = best_phrase.values + bias > best_token.values
        counts.wins[i] = int(wins.sum())
        counts.fitting_wins[i] = int((wins & phrase_fits).sum())
        counts.correct[i] = int(torch.where(wins, phrase_fits, token_right).sum())
    return counts
