"""Reading an emitted phrase back as its LM tokens, in one cached forward call.

With ``readback="tokens"`` a phrase still costs one decoding step (one logical id in
``generate``'s sequence), but the LM reads exactly the text: the step's forward call
feeds the phrase's ``k`` tokens at once, so the KV cache grows by ``k`` slots.

Every batch row of a step gets the same number of slots, the longest expansion in the
batch; a shorter one is right-aligned and preceded by masked filler slots, so the last
slot of every row holds its real last token and ``logits[:, -1]`` is each row's next-id
distribution. The slots each step took are kept on the cache (``readback_widths``); the
physical attention mask and positions are rebuilt from them and the full logical ids,
which beam search reorders together with the cache, so beams stay consistent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["WIDTHS_ATTRIBUTE", "PhysicalInputs", "expansion_lengths", "expansion_table", "physical_inputs"]

#: the attribute of a KV cache that records how many slots each logical step took
WIDTHS_ATTRIBUTE = "readback_widths"


@dataclass
class PhysicalInputs:
    """What the LM reads for the new logical steps: ``(B, W)`` ids and positions, ``(B, S)`` mask over all slots."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    widths: torch.Tensor  # (steps,) slots of every logical step so far, cached ones included


def expansion_table(token_ids: list[tuple[int, ...]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Phrases' tokens as a padded ``(P, max_len)`` table (right-aligned) and their ``(P,)`` lengths."""
    width = max((len(ids) for ids in token_ids), default=1)
    padded = [(0,) * (width - len(ids)) + tuple(ids) for ids in token_ids]  # one tensor call, not one per phrase
    table = torch.tensor(padded, dtype=torch.long).reshape(len(token_ids), width)
    lengths = torch.tensor([len(ids) for ids in token_ids], dtype=torch.long)
    return table.to(device), lengths.to(device)


def expansion_lengths(ids: torch.Tensor, vocab_size: int, lengths: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` mixed ids -> ``(B, T)`` tokens each id stands for (1 for a token)."""
    is_phrase = ids >= vocab_size  # no early exit on "no phrase": asking would wait for a GPU at every step
    return torch.where(is_phrase, lengths[(ids - vocab_size).clamp(min=0)], torch.ones_like(ids))


def physical_inputs(
    ids: torch.Tensor,
    logical_mask: torch.Tensor | None,
    cached_widths: torch.Tensor | None,
    vocab_size: int,
    table: torch.Tensor,
    lengths: torch.Tensor,
) -> PhysicalInputs:
    """The LM's inputs for the logical steps of ``ids`` past the cached ones.

    Args:
        ids: ``(B, L)`` every logical id so far (prompt included); ids ``>= V`` are phrases.
        logical_mask: ``(B, L)`` generate's attention mask (0 on left padding), or None.
        cached_widths: ``(C,)`` slots taken by each of the first ``C`` steps, already in the cache.
        table, lengths: from ``expansion_table`` over the phrase table.
    """
    batch, steps = ids.shape
    device = ids.device
    cached = 0 if cached_widths is None else int(cached_widths.numel())
    if cached > steps:
        raise ValueError(f"the KV cache holds {cached} steps but the sequence has {steps}; pass the full sequence")
    mask = torch.ones_like(ids) if logical_mask is None else logical_mask.to(device=device, dtype=torch.long)
    counts = expansion_lengths(ids, vocab_size, lengths)  # (B, L)
    new_widths = counts[:, cached:].amax(dim=0) if steps > cached else counts.new_zeros(0)
    widths = new_widths if cached == 0 else torch.cat([cached_widths.to(device), new_widths])
    # the one read from the device per step: the new steps' widths and the cached slots (shapes of what follows)
    *new_host, cached_slots = torch.cat([new_widths, widths[:cached].sum().view(1)]).tolist()
    new_slots = sum(new_host)
    # every slot: the logical step it belongs to and its offset inside that step
    step_of_slot = torch.repeat_interleave(torch.arange(steps, device=device), widths,
                                           output_size=cached_slots + new_slots)
    starts = torch.cumsum(widths, 0) - widths
    offset = torch.arange(step_of_slot.numel(), device=device) - starts[step_of_slot]
    first_real = (widths[step_of_slot] - counts[:, step_of_slot])  # (B, S): filler slots come first
    slot_mask = (offset >= first_real) & mask[:, step_of_slot].bool()
    positions = (slot_mask.long().cumsum(-1) - 1).clamp(min=0)

    if not new_slots:
        return PhysicalInputs(ids[:, :0], slot_mask.long(), positions[:, :0], widths)
    new_ids = ids[:, step_of_slot[-new_slots:]]
    new_offset = offset[-new_slots:] - first_real[:, -new_slots:]  # position inside the id's own tokens
    phrase = (new_ids - vocab_size).clamp(min=0)
    column = (table.shape[1] - lengths[phrase] + new_offset).clamp(0, table.shape[1] - 1)
    tokens = torch.where(new_ids >= vocab_size, table[phrase, column], new_ids)
    tokens = tokens.masked_fill(~slot_mask[:, -new_slots:], 0)
    return PhysicalInputs(tokens, slot_mask.long(), positions[:, -new_slots:], widths)
