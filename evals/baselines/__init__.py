"""Baselines the dynamic vocabulary is compared with (the bare LM needs no code of its own)."""

from .multiword import MultiWordLM, MultiWordVocab
from .multiword_training import MultiWordTrainConfig, train_multiword

__all__ = ["MultiWordLM", "MultiWordTrainConfig", "MultiWordVocab", "train_multiword"]
