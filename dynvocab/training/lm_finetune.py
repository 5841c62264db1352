"""Fine-tuning the LM itself on a domain corpus with LoRA (peft), on the library's one training loop: the baseline
that the dynamic vocabulary's domain claim is measured against (the paper's "LM fine-tuned on the domain").

The training texts are the corpus's indexed part (an embedded corpus's held-out documents are never trained on:
``dynvocab eval`` prompts with them), packed into ``max_length``-token sequences; every ``eval_every`` steps the mean
token loss over the first ``eval_texts`` held-out documents is logged (the learning curve, in ``log.jsonl``). The
export (``final/``) is the adapter alone, in peft's format, naming its base LM by the name it was trained from:
``dynvocab.loading.load_lm("runs/.../final")`` loads the base with the adapter folded in, and so does every command
that takes ``--model``, and ``dynvocab eval``'s ``:lm=DIR`` for one system.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from accelerate.utils import set_seed
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..config import JsonConfig, check_at_least
from ..data.assets import resolve_model
from ..data.corpora import CORPORA, corpus_split
from ..tokens.padding import pad_id, pad_sequences
from .corpus import CorpusSettings, batches, check_corpus_settings, corpus_field, wikipedia_split
from .loop import LOG_FILE, LoopSettings, TrainingLoop, check_loop_settings, loop_field

__all__ = ["LMFinetuneConfig", "LMFinetuner", "finetune_lm", "held_out_texts"]

logger = logging.getLogger(__name__)


@dataclass
class LMFinetuneConfig(LoopSettings, CorpusSettings, JsonConfig):
    """Settings of ``dynvocab finetune-lm``: LoRA on every attention and MLP projection of the LM."""

    model: str = field(default="smollm2", metadata={"help": "Hub name or path of the causal LM; 'smollm2' is the offline asset."})
    data: str = corpus_field("data", "licensedb")
    output_dir: str = field(default="runs/lm-finetune", metadata={"help": "Checkpoints, log.jsonl and the adapter (final/) go here."})
    max_length: int = field(default=256, metadata={"help": "Tokens per training sequence: every window of each text."})
    batch_size: int = field(default=8, metadata={"help": "Sequences per step."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (the update is scaled by alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    eval_every: int = field(default=50, metadata={"help": "Steps between held-out losses (0: none)."})
    eval_texts: int = field(default=64, metadata={"help": "Held-out documents the held-out loss is taken over."})
    learning_rate: float = loop_field("learning_rate", 2e-4)
    warmup_steps: int = loop_field("warmup_steps", 20)
    weight_decay: float = loop_field("weight_decay", 0.0)

    config_name: ClassVar[str] = "lm_finetune_config.json"

    def __post_init__(self) -> None:
        check_at_least(self, 1, ("max_length", "batch_size", "lora_r", "lora_alpha", "eval_texts"))
        check_at_least(self, 0, ("eval_every",))
        check_loop_settings(self)
        check_corpus_settings(self)
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout={self.lora_dropout} must be in [0, 1)")
        if self.max_length < 2:
            raise ValueError(f"max_length={self.max_length} must be >= 2: the loss predicts each token from those before")


def held_out_texts(config: LMFinetuneConfig) -> list[str]:
    """The texts of ``config.data`` that training never sees (an embedded corpus's held-out part; none for a file or
    dataset, whose held-out texts are the user's to keep apart)."""
    if config.data == "wikipedia":
        return wikipedia_split(held_out=config.held_out)[1]
    if config.data in CORPORA:
        return [document["text"] for document in corpus_split(config.data)[1]]
    return []


class LMFinetuner(TrainingLoop):
    """LoRA on the LM, the next-token loss over the domain's texts; the adapter is the export."""

    desc = "finetune-lm"

    def __init__(self, config: LMFinetuneConfig) -> None:
        from peft import LoraConfig, get_peft_model

        self.config = config
        set_seed(config.seed)
        path = resolve_model(config.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                          target_modules="all-linear", task_type="CAUSAL_LM")
        model = get_peft_model(lm, lora)
        super().__init__(model, config, config.output_dir)
        self.pad = pad_id(self.tokenizer)
        encode = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.stream = batches(config, encode, self.accelerator.process_index, self.accelerator.num_processes, whole=True)
        self.held_out = [encode(text)[: config.max_length] for text in held_out_texts(config)[: config.eval_texts]]

    def before_training(self) -> None:
        """The base LM's held-out loss, as the learning curve's step 0, written by a run that starts the log (a
        resume finds the first run's line there)."""
        log = self.output_dir / LOG_FILE
        if self.config.eval_every and self.accelerator.is_main_process and not (log.is_file() and log.stat().st_size):
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"step": 0, **self.evaluate()}) + "\n")

    def after_resume(self) -> None:
        for _ in range(self.step):  # the stream is a function of the config: skip ahead
            next(self.stream)

    def training_terms(self) -> dict[str, torch.Tensor]:
        ids, mask = pad_sequences(next(self.stream), self.pad, device=self.accelerator.device)
        return {"loss": self.module(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The mean token loss (and its perplexity) over the held-out documents: the learning curve."""
        kept = [ids for ids in self.held_out if len(ids) >= 2]
        if not kept:
            return {}
        self.module.eval()
        total, count = 0.0, 0
        for start in range(0, len(kept), self.config.batch_size):
            ids, mask = pad_sequences(kept[start : start + self.config.batch_size], self.pad, device=self.accelerator.device)
            logits = self.module(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            total += float(torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="sum"))
            count += int((target != -100).sum())
        self.module.train()
        return {"heldout_loss": total / count, "heldout_ppl": math.exp(total / count)}

    def write_export(self, directory: Path) -> None:
        """The adapter in peft's format, naming the base LM as it was given (``smollm2``, a Hub name or a path), the
        settings and the log so far."""
        model = self.unwrapped
        model.peft_config["default"].base_model_name_or_path = self.config.model
        model.save_pretrained(directory)
        log_file = self.output_dir / LOG_FILE
        log = [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines()] if log_file.exists() else []
        (directory / LMFinetuneConfig.config_name).write_text(json.dumps(asdict(self.config), indent=2), encoding="utf-8")
        (directory / LOG_FILE).write_text("".join(json.dumps(r) + "\n" for r in log), encoding="utf-8")


def finetune_lm(config: LMFinetuneConfig, resume: bool = False) -> list[dict]:
    """Fine-tune the LM with LoRA; ``output_dir/final`` loads with ``dynvocab.loading.load_lm``. Returns the log."""
    LMFinetuner(config).train(resume=resume)
    log_file = Path(config.output_dir) / LOG_FILE
    return [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines()]
