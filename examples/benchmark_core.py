"""Benchmark of the core on SmolLM2-135M with phrases cut from Wikipedia leads.

Every figure is a ratio or rate measured side by side in this one run:
(a) time to generate a fixed number of characters, with phrases against without;
(b) per-step decoding time at |P| = 1e3, 1e4, 1e5 against |P| = 0 (KV cache on);
(c) phrase-encoding throughput, phrases per second;
(d) extra resident memory of a 1e5-phrase table;
(e) text -> ids -> text round trips on Wikipedia leads.

    python examples/benchmark_core.py            # the full run (a few minutes on 2 cores)
    python examples/benchmark_core.py --tiny     # a quick smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import statistics
import time

import torch
from transformers import StoppingCriteriaList

from dynvocab import DynamicVocabLM
from dynvocab.data.assets import wikipedia_leads
from dynvocab.decoding.stopping import CharacterBudget
from dynvocab.hardware.precision import encode_autocast_dtype
from dynvocab.loading import load_lm
from retrieval import extract_phrases


def resident_gb(settle: bool = False) -> float:
    """Resident set size of this process in GB (Linux). ``settle``: collect garbage and hand the allocator's
    free pages back first (glibc ``malloc_trim``), so the figure is what live objects hold."""
    if settle:
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return kb / 1e6


def time_steps(model: DynamicVocabLM, prompt: torch.Tensor, steps: int, repeats: int) -> float:
    """Median seconds per decoding step: (time of ``steps`` new tokens - time of 1) / (steps - 1)."""

    def run(n: int) -> float:
        # eos_token_id=None: exactly n steps without min_new_tokens, whose processor scans all V + P ids each step
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=n, do_sample=False, eos_token_id=None)
        if prompt.is_cuda:
            torch.cuda.synchronize(prompt.device)  # the last step's kernels, queued, are part of its time
        seconds = time.perf_counter() - start
        if out.shape[1] != prompt.shape[1] + n:
            raise RuntimeError(f"generate made {out.shape[1] - prompt.shape[1]} steps, not {n}: the timing would be wrong")
        return seconds

    run(2)  # warm-up
    samples = [(run(steps) - run(1)) / (steps - 1) for _ in range(repeats)]
    return statistics.median(samples)


def token_lengths_ok(phrases, tokenizer, limit: int = 8):
    ids = tokenizer([p.text for p in phrases], add_special_tokens=False)["input_ids"]
    return [p for p, i in zip(phrases, ids) if 2 <= len(i) <= limit]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="causal LM name or path ('smollm2' is the offline asset)")
    parser.add_argument("--leads", type=int, default=4000, help="Wikipedia leads the phrase pool is cut from")
    parser.add_argument("--sizes", default="1000,10000,100000", help="phrase-table sizes for (b)")
    parser.add_argument("--steps", type=int, default=32, help="decoding steps timed for (b)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chars", type=int, default=300, help="continuation length for (a)")
    parser.add_argument("--encode", type=int, default=10000, help="phrases encoded for (c)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--encoder-layers", type=int, default=1)
    parser.add_argument("--phrase-dtype", default="float32", choices=["float32", "bfloat16"], help="phrase table dtype")
    parser.add_argument("--tiny", action="store_true", help="small sizes for a smoke run")
    args = parser.parse_args(argv)
    if args.tiny:
        args.sizes, args.steps, args.repeats, args.chars, args.encode, args.leads = "100,1000", 4, 1, 40, 500, 300
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]

    lm, tokenizer = load_lm(args.model)  # linear layers prepacked, as every command loads the LM
    model = DynamicVocabLM.from_causal_lm(
        lm, tokenizer, encoder_layers=args.encoder_layers, phrase_dtype=args.phrase_dtype
    ).eval()
    print(f"phrase table dtype: {args.phrase_dtype}")
    leads = wikipedia_leads()
    start = time.perf_counter()
    pool = token_lengths_ok(extract_phrases(leads[: args.leads], tokenizer, max_phrases=int(max(sizes) * 1.2)), tokenizer)
    print(f"phrase pool: {len(pool)} phrases from {args.leads} leads in {time.perf_counter() - start:.1f} s")
    results: dict = {}

    # (c) encoding throughput, 2-8-token phrases, float32 against the default encode_dtype ("auto")
    token_ids = [tuple(i) for i in tokenizer([p.text for p in pool[: args.encode]], add_special_tokens=False)["input_ids"]]
    vectors = {}
    for dtype in ("float32", model.dynvocab_config.encode_dtype):
        model.dynvocab_config.encode_dtype = dtype
        model._encode(token_ids[:512])  # warm-up
        start = time.perf_counter()
        vectors[dtype] = model._encode(token_ids)[1]
        results[f"encode_phrases_per_s_{dtype}"] = len(token_ids) / (time.perf_counter() - start)
    results["encode_phrases_per_s"] = results[f"encode_phrases_per_s_{dtype}"]
    cosine = torch.nn.functional.cosine_similarity(vectors["float32"], vectors[dtype], dim=-1).min().item()
    mean_len = sum(map(len, token_ids)) / len(token_ids)
    print(f"(c) phrase encoding: {results['encode_phrases_per_s']:.0f} phrases/s with encode_dtype={dtype!r} "
          f"({encode_autocast_dtype(dtype, model.device) or 'float32'}), "
          f"{results['encode_phrases_per_s'] / results['encode_phrases_per_s_float32']:.2f}x float32's "
          f"{results['encode_phrases_per_s_float32']:.0f}/s; lowest cosine to float32 {cosine:.6f} "
          f"(mean {mean_len:.1f} tokens; target >= 2000)")

    # (d) memory of the largest table
    before = resident_gb()
    model.set_phrases(pool[: max(sizes)])
    results["extra_rss_gb"] = resident_gb() - before
    print(f"(d) extra resident memory at |P|={len(model.phrase_table)}: {results['extra_rss_gb']:.3f} GB (target <= 0.6)")

    # (b) per-step decoding time, largest table first (shrinking keeps cached vectors)
    prompt = tokenizer(leads[5000]["text"][:200], return_tensors="pt").input_ids[:, :32]
    per_step = {}
    for size in sorted(sizes, reverse=True) + [0]:
        model.set_phrases(pool[:size])
        per_step[size] = time_steps(model, prompt, args.steps, args.repeats)
    baseline = per_step[0]
    for size in sorted(sizes):
        results[f"step_ratio_{size}"] = per_step[size] / baseline
        print(f"(b) per-step time at |P|={size}: {per_step[size] * 1e3:.1f} ms, {per_step[size] / baseline:.3f}x of |P|=0")
    print(f"    |P|=0: {baseline * 1e3:.1f} ms per step (target at 1e5 <= 1.15x)")

    # (a) time to a fixed number of characters, with and without phrases of related leads
    doc = leads[5000]
    related = token_lengths_ok(extract_phrases(leads[4990:5032], tokenizer, max_phrases=2000), tokenizer)
    times = {}
    for name, phrases in (("without", []), ("with", related)):
        model.set_phrases(phrases)
        stop = StoppingCriteriaList([CharacterBudget(model.decode, prompt.shape[1], args.chars)])
        model.generate(prompt, max_new_tokens=4, do_sample=False)
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=4 * args.chars, do_sample=False, stopping_criteria=stop)
        times[name] = (time.perf_counter() - start, out.shape[1] - prompt.shape[1])
    results["chars_time_ratio"] = times["with"][0] / times["without"][0]
    print(
        f"(a) {args.chars} characters: {times['with'][0]:.2f} s in {times['with'][1]} steps with {len(related)} phrases, "
        f"{times['without'][0]:.2f} s in {times['without'][1]} steps without: {results['chars_time_ratio']:.3f}x"
    )

    # (e) round trips of leads through tokenize/decode with a phrase table cut from the same leads
    sample = leads[5000:5200]
    model.set_phrases(token_lengths_ok(extract_phrases(sample, tokenizer, max_phrases=20000), tokenizer))
    results["round_trips"] = sum(model.decode(model.tokenize(d["text"])) == d["text"] for d in sample)
    print(f"(e) text -> ids -> text round trips: {results['round_trips']}/{len(sample)} leads (doc {doc['title']!r} first)")
    return results


if __name__ == "__main__":
    main()
