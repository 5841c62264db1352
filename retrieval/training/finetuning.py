"""``dynvocab finetune-encoder``: contrastive fine-tuning with in-batch negatives, then ANN hard negatives.

Pairs come from the corpus itself (:mod:`retrieval.training.pairs`). The first ``hard_negatives_from`` steps use
in-batch negatives only; then the model of that moment encodes the training documents, FAISS (or the
hybrid index) finds each remaining query's nearest wrong documents, and every later batch adds one of them
per query. With ``teacher`` set, a cross-encoder's scores over (positive, hard negative) are distilled
into the student (KL); a teacher that cannot be loaded (offline) is skipped with a warning. With ``anchor_weight``
above 0, a frozen copy of the starting encoder scores the same batch, and the KL from its softmaxed score rows to
the student's holds the model near the retriever it started from.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from accelerate import PartialState
from torch import nn

from dynvocab.config import JsonConfig
from dynvocab.data.assets import resolve_model
from dynvocab.data.corpora import CORPORA, corpus_split
from dynvocab.io.atomic import atomic_directory
from dynvocab.training.loop import EXPORT_DIR, LoopSettings, check_loop_settings
from encoders.dense import pool
from encoders.hybrid import HybridEncoder

from ..index.documents import load_documents
from .fusion import choose_sparse_weight, held_out_pairs
from .pairs import Pair, training_pairs
from .pretraining import step_indices
from .trainer import EncoderTrainer

__all__ = ["ENCODER_KINDS", "ContrastiveModule", "FinetuneConfig", "finetune", "likely_false_negative", "load_teacher",
           "held_out_fusion_pairs", "score_rows_kl", "tune_sparse_weight"]

logger = logging.getLogger(__name__)

ENCODER_KINDS = ("hybrid", "dense")
NEGATIVES_FILE = "hard_negatives"
#: the fusion weights tried after a hybrid fine-tuning and their held-out MRR@10, written into final/
FUSION_FILE = "fusion.json"


@dataclass
class FinetuneConfig(LoopSettings, JsonConfig):
    """Settings of ``dynvocab finetune-encoder``."""

    model: str = field(default="minilm", metadata={"help": "a pretrain-encoder output (final/), any BERT-like name or folder; 'minilm' offline"})
    encoder: str = field(default="hybrid", metadata={"help": "'hybrid' (CLS projection + sparse OT) or 'dense' (mean pooling, cosine)"})
    data: str = field(default="wikipedia", metadata={"help": "'wikipedia' or 'licenses' (training split) or a JSONL/text file"})
    text_field: str = field(default="text", metadata={"help": "field holding the text in JSONL files"})
    output_dir: str = field(default="runs/finetuned", metadata={"help": "checkpoints, log.jsonl and final/ go here"})
    batch_size: int = field(default=16, metadata={"help": "pairs per step and process (in-batch negatives)"})
    query_max_length: int = field(default=32, metadata={"help": "tokens per query"})
    max_length: int = field(default=128, metadata={"help": "tokens per document"})
    dense_dim: int = field(default=384, metadata={"help": "hybrid: size of the projected dense vector"})
    dense_pooling: str = field(default="mean", metadata={
        "help": "hybrid: what the dense part projects: 'mean' (the starting sentence encoder's own pooling; with dense_dim "
                "equal to its hidden size the dense part starts as that encoder) or 'cls' (DupMAE's [CLS])"})
    temperature: float = field(default=0.05, metadata={"help": "softmax temperature over scores: a cosine (dense) or the sum of the dense and sparse cosines (hybrid)"})
    hard_negatives_from: int = field(default=-1, metadata={"help": "step at which hard negatives are mined; -1: half of max_steps; >= max_steps: never"})
    hard_negative_depth: int = field(default=30, metadata={"help": "negatives are drawn from this many nearest wrong documents"})
    mining_documents: int = field(default=3000, metadata={"help": "training documents encoded for mining (positives included)"})
    teacher: str = field(default="", metadata={"help": "cross-encoder to distil from (Hub name or folder); '': none"})
    distill_weight: float = field(default=1.0, metadata={"help": "weight of the distillation KL"})
    anchor_weight: float = field(default=0.0, metadata={
        "help": "weight of the KL towards a frozen copy of the starting encoder's scores on the same batch (keeps what "
                "it knows); 0: none. At 1, on the full corpus, it kept half the sub-question gain and a third of the multi-hop "
                "loss (docs/retrieval-encoders.md)"})
    fusion_queries: int = field(default=500, metadata={
        "help": "hybrid: held-out inverse-cloze queries (pairs no step drew) the sparse part's fusion weight is chosen on "
                "after training; 0: keep the weight at 1"})
    fusion_documents: int = field(default=4000, metadata={
        "help": "hybrid: training documents those queries are searched over (their own among them)"})

    config_name: ClassVar[str] = "finetune_config.json"

    def __post_init__(self) -> None:
        if self.encoder not in ENCODER_KINDS:
            raise ValueError(f"encoder={self.encoder!r}; choose one of {ENCODER_KINDS}")
        for name in ("batch_size", "query_max_length", "max_length", "max_steps", "save_every", "log_every",
                     "dense_dim", "hard_negative_depth", "mining_documents", "fusion_documents"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        check_loop_settings(self)
        if isinstance(self.anchor_weight, bool) or not isinstance(self.anchor_weight, (int, float)) \
                or not self.anchor_weight >= 0:
            raise ValueError(f"anchor_weight={self.anchor_weight!r} must be a number >= 0; 0 turns the anchor off")
        if isinstance(self.fusion_queries, bool) or not isinstance(self.fusion_queries, int) or self.fusion_queries < 0:
            raise ValueError(f"fusion_queries={self.fusion_queries!r} must be an int >= 0; 0 keeps the fusion weight at 1")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature!r} must be > 0; 0.05 suits cosine scores")
        if self.batch_size < 2:
            raise ValueError(f"batch_size={self.batch_size} leaves no in-batch negatives; use at least 2")

    @property
    def mining_step(self) -> int:
        return self.max_steps // 2 if self.hard_negatives_from < 0 else self.hard_negatives_from


def score_rows_kl(student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(softmax(teacher) || softmax(student)) of scores ``(b, m)``, over the ``valid (b, m)``
    entries only (masked ones hold the dtype's minimum in both and add nothing); 0 when the rows are equal."""
    s, t = F.log_softmax(student.float(), 1), F.log_softmax(teacher.float(), 1)
    return (t.exp() * (t - s)).masked_fill(~valid, 0.0).sum(1).mean()


class ContrastiveModule(nn.Module):
    """InfoNCE over in-batch (and hard) negatives, plus optional KLs towards a cross-encoder's scores and towards a
    frozen ``anchor`` (the starting encoder) scoring the same batch."""

    def __init__(self, encoder: nn.Module, kind: str, temperature: float, distill_weight: float = 1.0,
                 anchor: nn.Module | None = None, anchor_weight: float = 0.0) -> None:
        super().__init__()
        self.encoder, self.kind, self.temperature, self.distill_weight = encoder, kind, temperature, distill_weight
        self.anchor, self.anchor_weight = anchor, anchor_weight
        if anchor is not None:
            anchor.requires_grad_(False).eval()

    def train(self, mode: bool = True) -> ContrastiveModule:
        """As ``nn.Module.train``, but the anchor stays in eval mode (no dropout): it is a fixed reference."""
        super().train(mode)
        if self.anchor is not None:
            self.anchor.eval()
        return self

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              encoder: nn.Module | None = None) -> tuple[torch.Tensor, ...]:
        """Unit vectors of ``encoder`` (default: the one trained): ``((n, d),)`` dense, or (dense, sparse) hybrid."""
        encoder = self.encoder if encoder is None else encoder
        if self.kind == "hybrid":
            return encoder(input_ids, attention_mask)
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return (F.normalize(pool(hidden, attention_mask, "mean"), dim=-1),)

    def scores(self, query_ids, query_mask, doc_ids, doc_mask, encoder: nn.Module | None = None) -> torch.Tensor:
        """``(b, m)`` query-document scores over the temperature."""
        queries, documents = self.embed(query_ids, query_mask, encoder), self.embed(doc_ids, doc_mask, encoder)
        return sum(q @ d.T for q, d in zip(queries, documents)) / self.temperature

    def forward(self, query_ids, query_mask, doc_ids, doc_mask, doc_keys, teacher=None) -> dict[str, torch.Tensor]:
        """Queries ``(b, tq)``; documents ``(m, td)``, the first ``b`` the positives; ``doc_keys (m,)`` document ids
        (other rows of a query's own document are not negatives); ``teacher (b, 2)`` scores of (positive, hard)."""
        scores = self.scores(query_ids, query_mask, doc_ids, doc_mask)
        batch = query_ids.shape[0]
        own = doc_keys[None, :] == doc_keys[:batch, None]
        own[torch.arange(batch), torch.arange(batch)] = False
        scores = scores.masked_fill(own, torch.finfo(scores.dtype).min)
        terms = {"contrastive": F.cross_entropy(scores.float(), torch.arange(batch, device=scores.device))}
        terms["loss"] = terms["contrastive"]
        if self.anchor is not None and self.anchor_weight > 0:
            with torch.no_grad():
                reference = self.scores(query_ids, query_mask, doc_ids, doc_mask, self.anchor)
            terms["anchor"] = score_rows_kl(scores, reference.masked_fill(own, torch.finfo(reference.dtype).min), ~own)
            terms["loss"] = terms["loss"] + self.anchor_weight * terms["anchor"]
        if teacher is not None:
            student = torch.stack([scores[torch.arange(batch), torch.arange(batch)], scores[:, batch:].diagonal()], 1)
            terms["distill"] = F.kl_div(F.log_softmax(student.float(), 1), F.log_softmax(teacher.float(), 1),
                                        log_target=True, reduction="batchmean")
            terms["loss"] = terms["loss"] + self.distill_weight * terms["distill"]
        return terms


def load_teacher(name: str):
    """``(model, tokenizer)`` of a cross-encoder, or ``None`` with a warning when it cannot be loaded (offline)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        model = AutoModelForSequenceClassification.from_pretrained(resolve_model(name)).eval()
        return model, AutoTokenizer.from_pretrained(resolve_model(name))
    except (OSError, ValueError) as error:
        logger.warning("skipping distillation: cross-encoder %r cannot be loaded here (%s); with internet pass a Hub "
                       "name such as cross-encoder/ms-marco-MiniLM-L-6-v2", name, str(error).splitlines()[0])
        return None


def _documents(config: FinetuneConfig) -> list[dict]:
    return corpus_split(config.data)[0] if config.data in CORPORA else load_documents(config.data, text_field=config.text_field)


def _build_encoder(config: FinetuneConfig):
    path = resolve_model(config.model)
    if config.encoder == "hybrid":
        encoder = HybridEncoder.from_pretrained(path, dense_dim=config.dense_dim, max_length=config.max_length,
                                                pooling=config.dense_pooling)
        return encoder.train(), encoder.tokenizer
    from transformers import AutoModel, AutoTokenizer

    return AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _export(module: nn.Module, folder: Path, tokenizer) -> None:
    module.encoder.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def likely_false_negative(text: str, title: str) -> bool:
    """Whether a mined "negative" ``text`` names the positive's ``title`` (its disambiguation in brackets left out):
    it is then likely about the positive's subject, and training it away would teach the retriever to miss it."""
    name = re.sub(r"\s*\([^)]*\)\s*$", "", title).strip()
    return len(name) >= 3 and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


class _Miner:
    """Mines one hard negative per pair of the steps from ``mining_step`` on, once; kept in ``output_dir`` as JSON."""

    def __init__(self, config: FinetuneConfig, module: ContrastiveModule, tokenizer, pairs: list[Pair],
                 documents: list[dict]) -> None:
        self.config, self.module, self.tokenizer, self.pairs = config, module, tokenizer, pairs
        self.documents = {d["id"]: d["text"] for d in documents}
        self.titles = {d["id"]: d.get("title") or d["id"] for d in documents}
        self.path = Path(config.output_dir) / NEGATIVES_FILE / "negatives.json"
        self.negatives: dict[int, str] | None = None
        if self.path.is_file():
            self.negatives = {int(k): v for k, v in json.loads(self.path.read_text(encoding="utf-8")).items()}

    def needed(self) -> list[int]:
        c = self.config
        return sorted({row for step in range(c.mining_step, c.max_steps)
                       for row in step_indices(step, c.batch_size, len(self.pairs), c.seed)})

    def __call__(self, step: int) -> None:
        if step < self.config.mining_step or self.negatives is not None:
            return
        from ..index.dense import DocumentIndex

        rows, rng = self.needed(), random.Random(self.config.seed)
        keys = list(dict.fromkeys(self.pairs[r][2] for r in rows))
        others = [k for k in self.documents if k not in set(keys)]
        keys += rng.sample(others, max(0, min(len(others), self.config.mining_documents - len(keys))))
        texts = [self.documents[k] for k in keys]
        queries = [self.pairs[r][0] for r in rows]
        self.module.eval()
        logger.info("mining hard negatives for %d queries among %d documents at step %d", len(rows), len(keys), step)
        with torch.inference_mode():
            found = _nearest(self.module, self.tokenizer, queries, texts, self.config)
        self.negatives, dropped = {}, 0
        for row, ranked in zip(rows, found):
            positive = self.pairs[row][2]
            wrong = [keys[i] for i in ranked if i >= 0 and keys[i] != positive][: self.config.hard_negative_depth]
            kept = [k for k in wrong if not likely_false_negative(self.documents[k], self.titles[positive])]
            dropped += len(wrong) - len(kept)
            if kept:
                self.negatives[row] = rng.choice(kept)
        logger.info("dropped %d mined negatives that name their positive's title (likely false negatives)", dropped)
        if PartialState().is_main_process:  # every process mines the same negatives (same weights): one writes them
            with atomic_directory(self.path.parent) as staging:
                (staging / self.path.name).write_text(json.dumps(self.negatives), encoding="utf-8")
        self.module.train()


def _nearest(module: ContrastiveModule, tokenizer, queries: list[str], texts: list[str], config: FinetuneConfig):
    """Row ids of each query's ``hard_negative_depth + 1`` nearest texts under the module's current weights."""
    depth = min(config.hard_negative_depth + 1, len(texts))
    if config.encoder == "hybrid":
        from ..index.hybrid import HybridIndex

        encoder = module.encoder.eval()
        index = HybridIndex.build(texts, vectors=encoder.encode(texts, show_progress_bar=True), vocab_size=encoder.vocab_size)
        return index.search(encoder.encode(queries, show_progress_bar=False), depth)[1]
    import faiss

    def vectors(items: list[str], length: int):
        out = []
        for start in range(0, len(items), 64):
            batch = tokenizer(items[start : start + 64], padding=True, truncation=True, max_length=length,
                              return_tensors="pt").to(next(module.parameters()).device)
            out.append(module.embed(batch["input_ids"], batch["attention_mask"])[0].float().cpu())
        return torch.cat(out).numpy()

    index = faiss.IndexFlatIP(module.encoder.config.hidden_size)
    index.add(vectors(texts, config.max_length))
    return index.search(vectors(queries, config.query_max_length), depth)[1]


def finetune(config: FinetuneConfig, resume: bool = False) -> dict[str, float]:
    """Fine-tune ``config.model``; ``output_dir/final`` loads with ``HybridEncoder``/``DenseEncoder`` by ``encoder``."""
    documents = _documents(config)
    pairs = training_pairs(documents, seed=config.seed)
    if len(pairs) < config.batch_size:
        raise ValueError(f"data={config.data!r} gives {len(pairs)} training pairs, fewer than batch_size={config.batch_size}")
    torch.manual_seed(config.seed)
    encoder, tokenizer = _build_encoder(config)
    anchor = copy.deepcopy(encoder) if config.anchor_weight > 0 else None
    module = ContrastiveModule(encoder, config.encoder, config.temperature, config.distill_weight, anchor,
                               config.anchor_weight)
    teacher = load_teacher(config.teacher) if config.teacher else None
    miner = _Miner(config, module, tokenizer, pairs, documents)
    keys: dict[str, int] = {}

    def batch_at(step: int, process: int, processes: int) -> dict[str, Any]:
        rows = step_indices(step, config.batch_size, len(pairs), config.seed, process, processes)
        chosen = [pairs[r] for r in rows]
        texts, ids = [p[1] for p in chosen], [p[2] for p in chosen]
        hard = [miner.negatives.get(r) for r in rows] if miner.negatives is not None and step >= config.mining_step else []
        if hard and all(h is not None for h in hard):
            texts += [miner.documents[h] for h in hard]
            ids += hard
        q = tokenizer([p[0] for p in chosen], padding=True, truncation=True, max_length=config.query_max_length, return_tensors="pt")
        d = tokenizer(texts, padding=True, truncation=True, max_length=config.max_length, return_tensors="pt")
        batch = {"query_ids": q["input_ids"], "query_mask": q["attention_mask"], "doc_ids": d["input_ids"],
                 "doc_mask": d["attention_mask"], "doc_keys": torch.tensor([keys.setdefault(i, len(keys)) for i in ids])}
        if teacher is not None and len(texts) == 2 * len(chosen):
            batch["teacher"] = _teacher_scores(teacher, [p[0] for p in chosen], texts, config.max_length)
        return batch

    trainer = EncoderTrainer(module, config, config.output_dir, batch_at, lambda m, folder: _export(m, folder, tokenizer),
                             before_step=miner)
    accelerator = trainer.accelerator
    fusion = held_out_fusion_pairs(config, pairs, documents, accelerator.num_processes) \
        if config.encoder == "hybrid" and config.fusion_queries else []
    last = trainer.train(resume=resume)
    if fusion:
        if accelerator.is_main_process:
            last["sparse_weight"] = tune_sparse_weight(config, fusion, documents)
        accelerator.wait_for_everyone()
    return last


def held_out_fusion_pairs(config: FinetuneConfig, pairs: list[Pair], documents: list[dict],
                          processes: int = 1) -> list[Pair]:
    """The held-out pairs the fusion weight will be chosen on (none drawn by any of ``processes``), found before
    training so a run that would have none fails at once instead of after its last step."""
    titles = {d.get("title") or d["id"] for d in documents}
    queries = held_out_pairs(pairs, titles, config.max_steps, config.batch_size, config.seed, processes,
                             config.fusion_queries)
    if not queries:
        raise ValueError(f"max_steps={config.max_steps} x batch_size={config.batch_size} draws every one of the "
                         f"{len(pairs)} training pairs, leaving none to choose the hybrid's fusion weight on; train "
                         "fewer steps, or pass --fusion_queries 0 to keep the weight at 1")
    return queries


def tune_sparse_weight(config: FinetuneConfig, queries: list[Pair], documents: list[dict]) -> float:
    """Choose the fusion weight of the hybrid in ``output_dir/final`` on held-out ``queries`` (pairs no training step
    drew), save it there (with the MRR@10 of every weight tried in ``fusion.json``) and return it."""
    final = Path(config.output_dir) / EXPORT_DIR
    encoder = HybridEncoder.from_pretrained(str(final), max_length=config.max_length)
    best, table, corpus = choose_sparse_weight(encoder, queries, documents, config.fusion_documents, seed=config.seed)
    record = {"sparse_weight": best, "rule": "smallest weight within one standard error of the best MRR@10",
              "mrr@10": {f"{w:g}": m for w, m in table.items()}, "queries": len(queries), "documents": corpus}
    with atomic_directory(final) as staging:
        encoder.with_sparse_weight(best).save_pretrained(staging)
        (staging / FUSION_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")
    return best


def _teacher_scores(teacher, queries: list[str], texts: list[str], max_length: int) -> torch.Tensor:
    """``(b, 2)`` cross-encoder scores of each query with its positive and its hard negative."""
    model, tokenizer = teacher
    b = len(queries)
    inputs = tokenizer(queries * 2, texts[:b] + texts[b:], padding=True, truncation=True, max_length=max_length,
                       return_tensors="pt")
    with torch.inference_mode():
        logits = model(**inputs).logits[:, 0]
    return logits.view(2, b).T.contiguous()
