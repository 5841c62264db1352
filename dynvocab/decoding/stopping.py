"""Stopping criteria that count text, not steps (a phrase step is many characters)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from transformers import StoppingCriteria

__all__ = ["CharacterBudget"]


class CharacterBudget(StoppingCriteria):
    """Stop each row once its continuation has decoded to at least ``max_chars`` characters.

    ``max_chars`` is one budget for every row, or one per row; ``prompt_length`` is the
    (padded) prompt width, where every row's continuation starts.
    """

    def __init__(self, decode, prompt_length: int, max_chars: int | Sequence[int]) -> None:
        self.one_budget = isinstance(max_chars, numbers.Integral)
        budgets = [int(max_chars)] if self.one_budget else [int(b) for b in max_chars]
        if not budgets or min(budgets) < 1:
            raise ValueError(f"max_chars must be >= 1 (one int, or one per row), got {max_chars}")
        self.decode, self.prompt_length, self.budgets = decode, prompt_length, budgets

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        budgets = self.budgets * len(input_ids) if self.one_budget else self.budgets
        if len(budgets) != len(input_ids):
            raise ValueError(f"{len(budgets)} character budgets for a batch of {len(input_ids)} rows; give one per row")
        done = [len(self.decode(row[self.prompt_length :])) >= budget for row, budget in zip(input_ids, budgets)]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
