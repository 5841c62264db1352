"""Stopping criteria that count text, not steps (a phrase step is many characters)."""

from __future__ import annotations

import torch
from transformers import StoppingCriteria


class CharacterBudget(StoppingCriteria):
    """Stop each row once its continuation has decoded to at least ``max_chars`` characters."""

    def __init__(self, decode, prompt_length: int, max_chars: int) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        self.decode, self.prompt_length, self.max_chars = decode, prompt_length, max_chars

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        done = [len(self.decode(row[self.prompt_length :])) >= self.max_chars for row in input_ids]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
