"""The main job on the embedded default: SmolLM2-135M, Wikipedia leads, MiniLM + FAISS, a trained encoder."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from retrieval.loading import demo_index
from retrieval.phrase_vectors import build_phrase_vectors

from ..data.corpora import corpus_split
from ..loading import SHIPPED_ENCODER, freeze_loaded_objects, load_dynamic_lm
from ..model import DynamicVocabLM

logger = logging.getLogger(__name__)

DEMO_TRAINING = dict(mode="frozen", max_steps=60, batch_size=8, max_length=64, learning_rate=1e-3, warmup_steps=10)


def trained_encoder(workdir: Path) -> Path:
    """The shipped encoder, else one cached in ``workdir``, else train a short one now and cache it."""
    if (SHIPPED_ENCODER / "phrase_encoder.safetensors").exists():
        return SHIPPED_ENCODER
    cached = workdir / "encoder" / "final"
    if (cached / "phrase_encoder.safetensors").exists():
        return cached
    from ..training.config import TrainConfig
    from ..training.trainer import Trainer

    config = TrainConfig(output_dir=str(workdir / "encoder"), **DEMO_TRAINING)
    print(f"No trained phrase encoder is cached: training a short one ({DEMO_TRAINING}) into {cached}.")
    Trainer(config).train()
    return cached


def run_demo(prompts: int = 4, max_new_tokens: int = 64, workdir: Path = Path(".cache/demo"), prompt_tokens: int = 32) -> list:
    """Run held-out prompts through retrieval + phrases + generation and compare with the bare LM."""
    from retrieval.config import PipelineConfig
    from retrieval.pipeline import PhrasePipeline

    torch.manual_seed(0)
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = trained_encoder(workdir)
    leads = corpus_split("wikipedia")[1]
    index = demo_index(workdir)
    model = load_dynamic_lm("smollm2", checkpoint)
    config = PipelineConfig(max_new_tokens=max_new_tokens)
    phrase_vectors_beside(model, index, config)
    pipeline = PhrasePipeline(model, index, config)
    freeze_loaded_objects()  # no full garbage collection over the loaded stack inside a timed request
    tokenizer = model.tokenizer
    print(f"Phrase encoder: {checkpoint}")
    print(f"Greedy decoding, both with no_repeat_ngram_size={config.no_repeat_ngram_size} (phrases count as their tokens)\n")
    # as `dynvocab eval` times: the first forwards of a process pack the linear layers' weights and build oneDNN's
    # kernels (about 1.4 s on a 2-core AVX2 CPU, all of it in whichever system ran first), so a held-out lead that is
    # not shown goes through both systems untimed
    warm_up = tokenizer.decode(tokenizer(leads[prompts]["text"]).input_ids[:prompt_tokens])
    pipeline(warm_up)
    bare_continuation(model, warm_up, max_new_tokens, config.no_repeat_ngram_size)
    results = []
    for lead in leads[:prompts]:
        prompt = tokenizer.decode(tokenizer(lead["text"]).input_ids[:prompt_tokens])
        result = pipeline(prompt)
        bare = bare_continuation(model, prompt, max_new_tokens, config.no_repeat_ngram_size)
        results.append((result, bare))
        print_result(lead["title"], result, bare)
    summarize(results)
    return results


def phrase_vectors_beside(model: DynamicVocabLM, index, config) -> None:
    """Encode the phrases of every indexed document once, beside the index (``dynvocab phrase-vectors``; resumes an
    interrupted build), so that a request reads its phrases' vectors instead of encoding them. A store that another
    encoder or other settings made is left as it is: the requests then encode their phrases."""
    try:
        build_phrase_vectors(model, index, config, show_progress_bar=True)
    except ValueError as error:
        print(f"Phrase vectors beside the index are not used ({error}); each request encodes its phrases.")


@torch.no_grad()
def bare_continuation(model: DynamicVocabLM, prompt: str, max_new_tokens: int, no_repeat_ngram_size: int = 0) -> dict:
    """The bare LM (same weights, KV cache on, same repetition safeguard) generating ``max_new_tokens`` tokens:
    text, seconds, steps."""
    ids = model.tokenizer(prompt, return_tensors="pt").input_ids
    start = time.perf_counter()
    out = model.lm.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, no_repeat_ngram_size=no_repeat_ngram_size)
    seconds = time.perf_counter() - start
    new = out[0, ids.shape[1] :]
    return {"text": model.tokenizer.decode(new, skip_special_tokens=True), "seconds": seconds, "steps": int(new.shape[0])}


def print_result(title: str, result, bare: dict) -> None:
    print(f"=== {title}")
    print(f"prompt: {result.prompt}")
    if result.grounded:  # cited spans, numbered by the document they stand in
        print(f"grounded ({result.steps} steps, {result.copied_tokens} tokens copied from drafts and phrases, "
              f"{100 * result.cited_share:.0f}% cited, [span]^n = found verbatim in document n):")
    else:
        print(f"dynamic ({result.steps} steps, {result.phrase_steps} phrases, [span]^n = phrase from source n):")
    print("  " + result.marked().replace("\n", " "))
    for line in result.sources():
        print("  " + line)
    print(f"bare LM ({bare['steps']} steps): {bare['text'].strip()}".replace("\n", " "))
    stages = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in result.latency.items())
    print(f"latency: {stages}; total {sum(result.latency.values()):.2f} s vs bare LM {bare['seconds']:.2f} s\n")


def summarize(results: list) -> None:
    steps = sum(r.steps for r, _ in results)
    phrase_steps = sum(r.phrase_steps for r, _ in results)
    bare_steps = sum(b["steps"] for _, b in results)
    mode = "grounded" if getattr(results[0][0], "grounded", False) else "dynamic"
    chars, bare_chars = sum(len(r.text) for r, _ in results), sum(len(b["text"]) for _, b in results)
    total = {k: sum(r.latency[k] for r, _ in results) for k in results[0][0].latency}
    print(f"=== summary over {len(results)} prompts")
    print(f"phrase steps: {phrase_steps}/{steps} ({100 * phrase_steps / max(steps, 1):.1f}%); cited: "
          f"{100 * sum(r.cited_share * len(r.text) for r, _ in results) / max(chars, 1):.0f}% of the characters")
    print(
        f"characters per step: {mode} {chars / max(steps, 1):.2f}, bare LM {bare_chars / max(bare_steps, 1):.2f}"
    )
    bare_seconds = sum(b["seconds"] for _, b in results)
    print("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in total.items()) + f"; bare LM {bare_seconds:.2f} s")
    # both sides decode the same number of steps, so the fair comparison is time per character written
    rate = sum(total.values()) / max(chars, 1)
    bare_rate = bare_seconds / max(bare_chars, 1)
    print(f"ms per character written: {mode} {1e3 * rate:.2f} (everything included), bare LM {1e3 * bare_rate:.2f} "
          f"({rate / bare_rate:.2f}x)")
