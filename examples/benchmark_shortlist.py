"""Benchmark of the shortlist head in DynamicVocabLM on SmolLM2-135M with 1e5 and 1e6 phrases.

Every figure comes from this one run, side by side:
(a) per decoding step (KV cache on, greedy, vector read-back) with the shortlist and with full (exact) scoring, each
    as a ratio to the same LM without phrases, timed in alternation (none, shortlist, full) so
    that the machine's load falls on all three alike; the median of the paired ratios;
(b) over real text (held-out Wikipedia leads, teacher-forced): how often the greedy argmax over
    tokens + phrases equals exact scoring's, recall@10 of the exact top-10 phrases, and the
    candidates scored per position, for several probe counts k, for the scorer's default head
    (clusters inside each first token) and for k-means over the whole table (``--ungrouped``);
(c) memory held by the largest table in bf16 (token ids and lookups, vectors, head), measured
    after garbage collection and ``malloc_trim``; the one-off fit time.

Phrases are real: token n-grams (2-8 SmolLM2 tokens) cut from the 10,033 Wikipedia leads,
ranked by frequency, encoded by the shipped phrase encoder (dynvocab/checkpoints/smollm2-wikipedia).

    python examples/benchmark_shortlist.py --vectors-cache .cache/shortlist/vectors-1e6.safetensors
    python examples/benchmark_shortlist.py --tiny      # a quick smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dynvocab import DynamicVocabLM, ShortlistConfig, ShortlistScorer
from dynvocab.data.assets import wikipedia_leads
from dynvocab.data.corpora import corpus_split
from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
from dynvocab.scoring.dot_product import DotProductScorer
from dynvocab.scoring.shortlist_head import ShortlistHead
from dynvocab.scoring.shortlist_scorer import SCORER_DEFAULTS
from retrieval import extract_phrases


def _sibling(name: str):
    """Another script of examples/ (not a package), imported by its file path."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", Path(__file__).resolve().parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_core = _sibling("benchmark_core")
resident_gb, time_steps = _core.resident_gb, _core.time_steps

#: #33's targets: the shortlist step against the step without phrases, by table size, and argmax agreement
STEP_TARGETS = {100_000: 1.05, 1_000_000: 1.15}
AGREEMENT_TARGET = 0.99


def targets(results: dict) -> list[str]:
    """#33's shortlist targets, met or missed and by how much, for the sizes the run measured."""
    lines = []
    probe = results["settings"]["probe"]
    for size, target in STEP_TARGETS.items():
        if f"steps_{size}" not in results:
            continue
        ratio = results[f"steps_{size}"]["shortlist"]["ratio"]
        sweep = results[f"agreement_{size}"]  # keyed by k, by str(k) once read back from JSON
        agree = sweep.get(probe, sweep.get(str(probe), {})).get("agree")
        lines.append(f"|P| = {size}: shortlist step {ratio:.3f}x (target <= {target}: "
                     f"{'met' if ratio <= target else f'missed by {ratio - target:.3f}'})"
                     + ("" if agree is None else f"; argmax agreement at probe {probe} {agree:.4f} (target >= "
                        f"{AGREEMENT_TARGET}: {'met' if agree >= AGREEMENT_TARGET else 'missed'})"))
    return lines


@torch.no_grad()
def agreement(model, head: ShortlistHead, texts: list[str], probes: list[int], max_tokens: int) -> dict[int, dict]:
    """Teacher-forced positions of ``texts``: argmax agreement and recall@10 of ``head`` against exact scoring."""
    vectors, exact = model.phrase_output_vectors(), DotProductScorer()
    totals = {k: {"agree": 0.0, "recall10": 0.0, "candidates": 0.0} for k in probes}
    positions = 0
    for text in texts:
        ids = model.tokenizer(text, return_tensors="pt").input_ids[:, :max_tokens].to(model.lm.device)
        out = model.lm(ids, output_hidden_states=True)
        hidden, lm_logits = out.hidden_states[-1][0], out.logits[0]  # (T, d), (T, V)
        full = exact(hidden[None], vectors)[0]  # (T, P)
        best = torch.cat([lm_logits, full], -1).argmax(-1)
        top10 = full.topk(10, dim=-1).indices
        for k in probes:
            head.config.probe = k
            short = head.dense_scores(hidden, vectors)[:, 0]
            found = torch.isfinite(short)
            totals[k]["agree"] += float((torch.cat([lm_logits, short], -1).argmax(-1) == best).sum())
            totals[k]["recall10"] += float(found.gather(1, top10).float().mean(-1).sum())
            totals[k]["candidates"] += float(found.sum())
        positions += hidden.shape[0]
    return {k: {name: value / positions for name, value in row.items()} | {"positions": positions} for k, row in totals.items()}


def paired_step_ratios(bare: DynamicVocabLM, model: DynamicVocabLM, scorers: dict, prompt: torch.Tensor,
                       steps: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per-step ms of the bare LM and of ``model`` under each scorer, timed in turn ``repeats`` times; the median
    of each scorer's ratio to the bare step it was timed beside, and of the ms it added to that step (what a faster
    or slower LM step would be divided into)."""
    times: dict[str, list[float]] = {"none": [], **{name: [] for name in scorers}}
    for _ in range(repeats):
        times["none"].append(time_steps(bare, prompt, steps, 1))
        for name, scorer in scorers.items():
            model.scorer = scorer
            times[name].append(time_steps(model, prompt, steps, 1))
    return {name: {"ms": statistics.median(values) * 1e3,
                   "ratio": statistics.median(v / none for v, none in zip(values, times["none"])),
                   "added_ms": statistics.median(v - none for v, none in zip(values, times["none"])) * 1e3}
            for name, values in times.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="causal LM name or path ('smollm2' is the offline asset)")
    parser.add_argument("--checkpoint", default=str(SHIPPED_ENCODER), help="phrase encoder; 'none' for an untrained one")
    parser.add_argument("--sizes", default="100000,1000000", help="phrase-table sizes")
    parser.add_argument("--probe", type=int, default=SCORER_DEFAULTS["probe"], help="k: clusters probed in the timed runs")
    parser.add_argument("--probes", default="32,64,96,128", help="k values of the agreement sweep")
    parser.add_argument("--cluster-size", type=int, default=SCORER_DEFAULTS["cluster_size"],
                        help="phrases per cluster inside a first token")
    parser.add_argument("--ungrouped", action="store_true", help="also measure k-means over the whole table "
                        "(the earlier default: m = 4 sqrt(|P|), members + top-256, probes 8 and 32)")
    parser.add_argument("--steps", type=int, default=32, help="decoding steps timed")
    parser.add_argument("--repeats", type=int, default=15, help="alternating timing rounds")
    parser.add_argument("--texts", type=int, default=16, help="held-out leads for the agreement figures")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per agreement text")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="'cuda': the LM, the table and the head on the GPU; memory is "
                                                        "then the GPU's allocated bytes")
    parser.add_argument("--output", default=None, help="write the results JSON (and a .md beside it) here")
    parser.add_argument("--vectors-cache", default=None, help="safetensors file: phrase vectors saved by an earlier run "
                        "are reused (the pool and checkpoint must be the same), else written after encoding")
    parser.add_argument("--tiny", action="store_true", help="small sizes for a smoke run")
    args = parser.parse_args(argv)
    if args.tiny:
        args.sizes, args.steps, args.repeats, args.texts, args.max_tokens, args.probes = "300,3000", 4, 1, 2, 24, "2,4"
    torch.set_num_threads(args.threads)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    probes = [int(k) for k in args.probes.split(",")]
    config = ShortlistConfig(**(SCORER_DEFAULTS | {"probe": args.probe, "cluster_size": args.cluster_size}),
                             exact_below=min(sizes))
    device = torch.device(args.device)
    model = load_dynamic_lm(args.model, None if args.checkpoint == "none" else args.checkpoint).to(device)
    model.dynvocab_config.phrase_dtype = "bfloat16"
    memory_gb = resident_gb if device.type == "cpu" else lambda settle=False: torch.cuda.memory_allocated(device) / 1e9
    # Timed steps read an emitted phrase back as one vector, so every step feeds one position, as the bare LM's
    # does: the token read-back adds the phrase's other tokens to the next step, a cost of the read-back, not the head.
    model.dynvocab_config.readback = "vector"
    bare = DynamicVocabLM.from_causal_lm(model.lm, model.tokenizer).eval()  # the same LM weights, no phrases
    tokenizer = model.tokenizer
    leads = wikipedia_leads()
    start = time.perf_counter()
    pool = extract_phrases(leads[: 400 if args.tiny else None], tokenizer, max_phrases=max(sizes))
    print(f"phrase pool: {len(pool)} token n-grams in {time.perf_counter() - start:.0f} s")
    results: dict = {"settings": vars(args) | {"shortlist": config.to_dict()}, "pool": len(pool)}

    before = memory_gb(settle=True)
    start = time.perf_counter()
    cache = Path(args.vectors_cache) if args.vectors_cache else None
    if cache is not None and cache.exists():
        model.phrase_table.add(pool[: max(sizes)])
        model.restore_phrase_output_vectors(load_file(cache)["output"].clone().to(device))
    else:
        model.set_phrases(pool[: max(sizes)], mid_sentence_forms=False)
        if cache is not None:
            save_file({"output": model.phrase_output_vectors().contiguous()}, cache)
    results["encode_s"] = time.perf_counter() - start
    table_gb = memory_gb(settle=True) - before
    results["vectors_gb"] = model.phrase_output_vectors().numel() * model.phrase_output_vectors().element_size() / 1e9
    prompt = tokenizer(leads[5000]["text"][:200], return_tensors="pt").input_ids[:, :32].to(device)
    texts = [d["text"] for d in corpus_split("wikipedia")[1][: args.texts]]
    for size in sorted(sizes, reverse=True):
        model.set_phrases(pool[:size], mid_sentence_forms=False)
        shortlist = ShortlistScorer(model.phrase_table, config)
        rss, start = memory_gb(settle=True), time.perf_counter()
        head = shortlist.fit(model.phrase_output_vectors())
        results[f"fit_s_{size}"] = time.perf_counter() - start
        results[f"head_mb_{size}"] = sum(b.numel() * b.element_size() for b in head.buffers()) / 1e6
        if size == max(sizes):
            results["memory_gb"] = {"table_and_vectors": table_gb, "head": memory_gb(settle=True) - rss}
        results[f"clusters_{size}"], results[f"subset_width_{size}"] = head.num_clusters, head.subsets.shape[1]
        results[f"steps_{size}"] = paired_step_ratios(bare, model, {"shortlist": shortlist, "full": DotProductScorer()},
                                                      prompt, args.steps, args.repeats)
        results[f"agreement_{size}"] = agreement(model, head, texts, probes, args.max_tokens)
        head.config.probe = args.probe
        if args.ungrouped:
            start = time.perf_counter()
            whole = ShortlistHead.from_vectors(model.phrase_output_vectors(), ShortlistConfig())
            results[f"ungrouped_fit_s_{size}"] = time.perf_counter() - start
            results[f"ungrouped_agreement_{size}"] = agreement(model, whole, texts, [8, 32], args.max_tokens)
            del whole
        print(f"|P|={size}: fit {results[f'fit_s_{size}']:.1f} s, m={head.num_clusters}; steps "
              f"{json.dumps(results[f'steps_{size}'])}; agreement {json.dumps(results[f'agreement_{size}'])}", flush=True)
        model.scorer = DotProductScorer()
        del shortlist, head
    print(f"memory of the {max(sizes)}-phrase bf16 table: {json.dumps(results['memory_gb'])} GB "
          f"(vectors {results['vectors_gb']:.2f} GB)")
    for line in targets(results):
        print(line)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        Path(args.output).with_suffix(".md").write_text(markdown(results), encoding="utf-8")
    return results


def markdown(results: dict) -> str:
    """The benchmark's tables from its results."""
    sizes = sorted(int(k.removeprefix("fit_s_")) for k in results if k.startswith("fit_s_"))
    lines = ["# Shortlist head in DynamicVocabLM (SmolLM2-135M)", "", f"Settings: `{json.dumps(results['settings'])}`", "",
             "| per decoding step | |P| | ms (median) | ratio to no phrases (median of paired runs) "
             "| ms added (median of paired runs) |", "|---|---|---|---|---|"]
    for size in sizes:
        for name, row in results[f"steps_{size}"].items():
            added = f"{row['added_ms']:+.2f}" if "added_ms" in row else "-"
            lines.append(f"| {name} | {size} | {row['ms']:.1f} | {row['ratio']:.3f} | {added} |")
    for size in sizes:
        lines += ["", f"## |P| = {size}: fit {results[f'fit_s_{size}']:.0f} s, {results[f'clusters_{size}']} clusters "
                      f"inside first tokens, head tensors {results[f'head_mb_{size}']:.0f} MB", "",
                  "| head | probe k | argmax agreement | recall@10 | candidates per position | positions |",
                  "|---|---|---|---|---|---|"]
        for key, name in ((f"agreement_{size}", "first-token clusters"), (f"ungrouped_agreement_{size}", "whole-table k-means")):
            for k, row in results.get(key, {}).items():
                lines.append(f"| {name} | {k} | {row['agree']:.4f} | {row['recall10']:.4f} | {row['candidates']:.0f} | "
                             f"{row['positions']} |")
    memory = results["memory_gb"]
    lines += ["", f"Memory of the {max(sizes)}-phrase bf16 table after garbage collection and malloc_trim: token ids, "
                  f"lookups and vectors {memory['table_and_vectors']:.2f} GB (the vectors alone {results['vectors_gb']:.2f} "
                  f"GB), head {memory['head']:.2f} GB; total {sum(memory.values()):.2f} GB. The phrase texts are the "
                  f"caller's list and not counted. Encoding (or loading the cached vectors) took {results['encode_s']:.0f} s."]
    if measured := targets(results):
        lines += ["", "#33's targets (the step ratio is the median of the paired rounds):", ""] + [f"- {t}" for t in measured]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
