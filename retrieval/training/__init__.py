"""Training document encoders: DupMAE pre-training and contrastive fine-tuning, on the library's one training loop."""

from dynvocab.training.loop import EXPORT_DIR

from .finetuning import FinetuneConfig, finetune
from .pretraining import PretrainConfig, pretrain

__all__ = ["EXPORT_DIR", "FinetuneConfig", "PretrainConfig", "finetune", "pretrain"]
