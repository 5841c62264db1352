"""The paper's evaluation protocol: held-out prefixes, continuations by each system, every metric.

Prompts are the first ``prefix_tokens`` tokens of held-out documents; the reference is
the next ``continuation_tokens`` tokens. The bare LM generates ``continuation_tokens``
tokens (KV cache on); a dynamic-vocabulary system generates until it has the
reference's number of characters (the same character budget), with phrases from the
top-k retrieved training documents. Generations are appended to
``generations.jsonl`` as they finish, so a stopped run resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

SYSTEMS = ("bare", "dynamic", "dynamic-untrained", "dynamic-no-phrases")


@dataclass
class EvalConfig:
    """Settings of ``dynvocab eval``; every one is recorded in the results."""

    data: str = field(default="wikipedia", metadata={"help": "Embedded corpus of the held-out prompts: 'wikipedia' or 'licenses'."})
    model: str = field(default="smollm2", metadata={"help": "Causal LM name or path ('smollm2' is the offline asset)."})
    checkpoint: str | None = field(default=None, metadata={"help": "Trained phrase encoder; default: the shipped one."})
    index: str | None = field(default=None, metadata={"help": "Document index dir; default: an index of --data's training part."})
    encoder: str = field(default="minilm", metadata={"help": "The index's document encoder (name or path)."})
    systems: str = field(default="bare,dynamic", metadata={"help": f"Comma-separated systems from {SYSTEMS}."})
    num_prompts: int = field(default=200, metadata={"help": "Held-out documents used as prompts."})
    prefix_tokens: int = field(default=32, metadata={"help": "Prompt length in LM tokens."})
    continuation_tokens: int = field(default=128, metadata={"help": "Continuation length in LM tokens (bare LM)."})
    decoding: str = field(default="greedy", metadata={"help": "'greedy' or 'nucleus'."})
    top_p: float = field(default=0.95, metadata={"help": "Nucleus mass for decoding='nucleus'."})
    top_k_docs: int = field(default=32, metadata={"help": "Documents retrieved per prompt."})
    max_phrases: int = field(default=2048, metadata={"help": "Phrases plugged in per prompt at most."})
    mauve_featurizer: str = field(default="minilm", metadata={"help": "'minilm', 'lm' (the scorer LM) or 'gpt2-large'."})
    mauve_seeds: int = field(default=3, metadata={"help": "MAUVE runs with different k-means seeds."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    output_dir: str = field(default="runs/eval", metadata={"help": "generations.jsonl, results.json, report.md, plots."})

    def __post_init__(self) -> None:
        unknown = [s for s in self.system_names if s not in SYSTEMS]
        if unknown:
            raise ValueError(f"systems={self.systems!r} has unknown names {unknown}; choose from {list(SYSTEMS)}")
        if self.data not in ("wikipedia", "licenses"):
            raise ValueError(f"data={self.data!r}; choose 'wikipedia' or 'licenses'")
        if self.decoding not in ("greedy", "nucleus"):
            raise ValueError(f"decoding={self.decoding!r}; choose 'greedy' or 'nucleus'")
        if self.mauve_featurizer not in ("minilm", "lm", "gpt2-large"):
            raise ValueError(f"mauve_featurizer={self.mauve_featurizer!r}; choose 'minilm', 'lm' or 'gpt2-large'")
        if min(self.num_prompts, self.prefix_tokens, self.continuation_tokens, self.mauve_seeds) < 1:
            raise ValueError("num_prompts, prefix_tokens, continuation_tokens and mauve_seeds must be >= 1")

    @property
    def system_names(self) -> list[str]:
        return [s.strip() for s in self.systems.split(",") if s.strip()]


def held_out_prompts(tokenizer, config: EvalConfig) -> list[dict]:
    """``{"id", "prompt", "reference"}`` from held-out documents long enough for both parts."""
    from dynvocab.demo import corpus_split

    prompts = []
    for lead in corpus_split(config.data)[1]:
        ids = tokenizer(lead["text"], add_special_tokens=False).input_ids
        if len(ids) >= config.prefix_tokens + config.continuation_tokens:
            prompt = tokenizer.decode(ids[: config.prefix_tokens])
            reference = tokenizer.decode(ids[config.prefix_tokens : config.prefix_tokens + config.continuation_tokens])
            prompts.append({"id": lead["id"], "prompt": prompt, "reference": reference})
        if len(prompts) == config.num_prompts:
            break
    if len(prompts) < config.num_prompts:
        logger.warning("only %d held-out documents are long enough; evaluating those", len(prompts))
    return prompts


class Generators:
    """Builds each system once and generates one continuation per call."""

    def __init__(self, config: EvalConfig) -> None:
        from dynvocab import DynamicVocabLM
        from dynvocab.demo import SHIPPED_ENCODER, load_dynamic_lm, load_lm

        self.config = config
        self.lm, self.tokenizer = load_lm(config.model)
        self.trained = load_dynamic_lm(config.model, config.checkpoint or SHIPPED_ENCODER)
        self.untrained = DynamicVocabLM.from_causal_lm(self.lm, self.tokenizer).eval()
        self._index = None

    @property
    def index(self):
        if self._index is None:
            from encoders import DenseEncoder
            from retrieval import DocumentIndex

            from dynvocab.assets import resolve_model
            from dynvocab.demo import demo_index, document_encoder

            path, name = self.config.index, self.config.encoder
            encoder = document_encoder() if name == "minilm" else DenseEncoder(resolve_model(name))
            self._index = (
                DocumentIndex.load(path, encoder=encoder) if path else demo_index(Path(".cache/demo"), self.config.data)
            )
        return self._index

    def sampling(self) -> dict:
        return {"do_sample": True, "top_p": self.config.top_p, "top_k": 0} if self.config.decoding == "nucleus" else {"do_sample": False}

    @torch.no_grad()
    def __call__(self, system: str, item: dict) -> dict:
        torch.manual_seed(self.config.seed)
        if system == "bare":
            return self._bare(item)
        from retrieval.pipeline import PhrasePipeline, PipelineConfig

        model = self.trained if system == "dynamic" else self.untrained
        pipeline_config = PipelineConfig(
            top_k=self.config.top_k_docs, max_phrases=0 if system == "dynamic-no-phrases" else self.config.max_phrases,
            max_new_tokens=2 * self.config.continuation_tokens, max_chars=len(item["reference"]),
            do_sample=self.config.decoding == "nucleus", top_p=self.config.top_p,
        )
        result = PhrasePipeline(model, self.index, pipeline_config)(item["prompt"])
        return {"text": result.text, "steps": result.steps, "phrase_steps": result.phrase_steps,
                "phrases": result.num_phrases, "latency": result.latency}

    def _bare(self, item: dict) -> dict:
        ids = self.tokenizer(item["prompt"], return_tensors="pt").input_ids
        start = time.perf_counter()
        out = self.lm.generate(ids, max_new_tokens=self.config.continuation_tokens, **self.sampling())
        seconds = time.perf_counter() - start
        new = out[0, ids.shape[1] :]
        return {"text": self.tokenizer.decode(new, skip_special_tokens=True), "steps": int(new.shape[0]),
                "phrase_steps": 0, "phrases": 0,
                "latency": {"retrieve": 0.0, "extract": 0.0, "encode": 0.0, "decode": seconds}}


def generate_all(config: EvalConfig) -> tuple[list[dict], "Generators"]:
    """Every (system, prompt) generation, resuming from ``generations.jsonl``."""
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "generations.jsonl"
    done = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    seen = {(r["system"], r["id"]) for r in done}
    generators = Generators(config)
    prompts = held_out_prompts(generators.tokenizer, config)
    todo = [(s, p) for s in config.system_names for p in prompts if (s, p["id"]) not in seen]
    if seen:
        logger.info("resuming: %d generations done, %d to go", len(seen), len(todo))
    with open(path, "a", encoding="utf-8") as f:
        for system, item in tqdm(todo, desc="generate"):
            record = {"system": system, "id": item["id"], "prompt": item["prompt"], "reference": item["reference"],
                      **generators(system, item)}
            f.write(json.dumps(record) + "\n")
            f.flush()
            done.append(record)
    wanted = {p["id"] for p in prompts}
    return [r for r in done if r["id"] in wanted and r["system"] in config.system_names], generators


def save_config(config: EvalConfig) -> None:
    (Path(config.output_dir) / "eval_config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
