"""Batched generation: left-padded prompts, per-row character budgets, each continuation cut where its row ended."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import StoppingCriteriaList

from ..tokens.padding import pad_sequences
from .stopping import CharacterBudget

__all__ = ["generate_continuations"]


@torch.no_grad()
def generate_continuations(
    model,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    max_new_tokens: int,
    decode: Callable[[Sequence[int]], str] | None = None,
    max_chars: Sequence[int] | None = None,
    **generate_kwargs,
) -> list[list[int]]:
    """The new ids of each prompt, generated in one left-padded batch.

    ``model`` is anything with ``generate`` (an HF causal LM, a ``DynamicVocabLM``).
    With ``max_chars`` each row stops once ``decode`` of its continuation reaches its
    budget. A row's continuation ends where ``generate`` finished it: at its first
    end-of-text token (kept, it was a decoding step) or at the step that met its
    budget; the padding ``generate`` writes after that is cut.
    """
    if max_chars is not None and decode is None:
        raise ValueError("max_chars needs decode, the function that turns a row's new ids into text")
    ids, mask = pad_sequences(prompts, pad_id, side="left", device=model.device)
    stopping = StoppingCriteriaList([CharacterBudget(decode, ids.shape[1], max_chars)] if max_chars is not None else [])
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad_id, stopping_criteria=stopping,
        **generate_kwargs,
    )
    eos = generate_kwargs.get("eos_token_id", model.generation_config.eos_token_id)
    eos = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    continuations = []
    for row, new in enumerate(out[:, ids.shape[1] :].tolist()):
        if pad_id not in eos:  # pure padding after an early stop
            while new and new[-1] == pad_id:
                new.pop()
        end = next((i + 1 for i, token in enumerate(new) if token in eos), len(new))
        new = new[:end]
        if max_chars is not None:  # a pad equal to end-of-text is not a step of a row stopped by its budget
            while len(new) > 1 and len(decode(new[:-1])) >= max_chars[row]:
                new.pop()
        continuations.append(new)
    return continuations
