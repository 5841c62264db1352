"""One decoding step's choice: ``generate()``'s sampling warpers, in its order, and the draw they feed.

``generate_verified`` (verified and grounded decoding) and the server's running batch choose each next id this way,
as transformers' ``generate()`` (under ``DynamicVocabLM.generate``) does: the same settings sample the same law
everywhere, and a change to it lands once.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

__all__ = ["choose", "sampling_warpers"]


def sampling_warpers(do_sample: bool, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> LogitsProcessorList:
    """``generate()``'s warpers for these settings, in its order (temperature, top-k, top-p); none when greedy."""
    warpers = LogitsProcessorList()
    if not do_sample:
        return warpers
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers


def choose(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """The next id ``(B,)`` from processed and warped ``(B, N)`` scores: the best, or drawn from their softmax."""
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(1)
    return scores.argmax(-1)
