"""Benchmark of the shortlist head in DynamicVocabLM on SmolLM2-135M with 1e5 and 1e6 phrases.

Every figure comes from this one run, side by side:
(a) per decoding step (KV cache on, greedy) at |P| = 0, and at each size with the shortlist
    and with full (exact) scoring, as ratios to |P| = 0;
(b) over real text (held-out Wikipedia leads, teacher-forced): how often the greedy argmax over
    tokens + phrases equals exact scoring's, recall@10 of the exact top-10 phrases, and the
    candidates scored per position, for several probe counts k;
(c) extra resident memory of the largest table in bf16 (phrase table + vectors + head) and the
    head's own tensors; the one-off fit time.

Phrases are real: token n-grams (2-8 SmolLM2 tokens) cut from the 10,033 Wikipedia leads,
ranked by frequency, encoded by the shipped phrase encoder (examples/checkpoints/smollm2-wikipedia).

    python examples/benchmark_shortlist.py             # the full run (about 15 min on 2 cores)
    python examples/benchmark_shortlist.py --tiny      # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_core import resident_gb, time_steps  # noqa: E402

from dynvocab import ShortlistConfig, ShortlistScorer  # noqa: E402
from dynvocab.assets import wikipedia_leads  # noqa: E402
from dynvocab.corpora import corpus_split  # noqa: E402
from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm  # noqa: E402
from dynvocab.scoring import DotProductScorer  # noqa: E402
from retrieval import extract_phrases  # noqa: E402


@torch.no_grad()
def agreement(model, texts: list[str], probes: list[int], max_tokens: int) -> dict[int, dict[str, float]]:
    """Teacher-forced positions of ``texts``: argmax agreement and recall@10 of the shortlist against exact scoring."""
    head, vectors, exact = model.scorer.head, model.phrase_output_vectors(), DotProductScorer()
    totals = {k: {"agree": 0.0, "recall10": 0.0, "candidates": 0.0} for k in probes}
    positions = 0
    for text in texts:
        ids = model.tokenizer(text, return_tensors="pt").input_ids[:, :max_tokens]
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="causal LM name or path ('smollm2' is the offline asset)")
    parser.add_argument("--checkpoint", default=str(SHIPPED_ENCODER), help="phrase encoder; 'none' for an untrained one")
    parser.add_argument("--sizes", default="100000,1000000", help="phrase-table sizes")
    parser.add_argument("--probe", type=int, default=8, help="k: clusters probed per query in the timed runs")
    parser.add_argument("--probes", default="2,4,8,16", help="k values of the agreement sweep")
    parser.add_argument("--subset-size", type=int, default=256, help="r: top ids per cluster besides its members")
    parser.add_argument("--num-clusters", type=int, default=0, help="m; 0: 4 * sqrt(|P|)")
    parser.add_argument("--steps", type=int, default=32, help="decoding steps timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--texts", type=int, default=16, help="held-out leads for the agreement figures")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per agreement text")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None, help="write the results JSON here")
    parser.add_argument("--vectors-cache", default=None, help="safetensors file: phrase vectors saved by an earlier run "
                        "are reused (the pool and checkpoint must be the same), else written after encoding")
    parser.add_argument("--tiny", action="store_true", help="small sizes for a smoke run")
    args = parser.parse_args(argv)
    if args.tiny:
        args.sizes, args.steps, args.repeats, args.texts, args.max_tokens, args.probes = "300,3000", 4, 1, 2, 24, "2,4"
    torch.set_num_threads(args.threads)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    config = ShortlistConfig(num_clusters=args.num_clusters, subset_size=args.subset_size, probe=args.probe,
                             exact_below=min(sizes))
    model = load_dynamic_lm(args.model, None if args.checkpoint == "none" else args.checkpoint)
    model.dynvocab_config.phrase_dtype = "bfloat16"
    tokenizer = model.tokenizer
    leads = wikipedia_leads()
    start = time.perf_counter()
    pool = extract_phrases(leads[: 400 if args.tiny else None], tokenizer, max_phrases=max(sizes))
    print(f"phrase pool: {len(pool)} token n-grams in {time.perf_counter() - start:.0f} s")
    results: dict = {"settings": vars(args) | {"shortlist": config.to_dict()}, "pool": len(pool)}

    before = resident_gb()
    start = time.perf_counter()
    cache = Path(args.vectors_cache) if args.vectors_cache else None
    if cache is not None and cache.exists():
        model.phrase_table.add(pool[: max(sizes)])
        model.restore_phrase_output_vectors(load_file(cache)["output"])
    else:
        model.set_phrases(pool[: max(sizes)], mid_sentence_forms=False)
        if cache is not None:
            save_file({"output": model.phrase_output_vectors().contiguous()}, cache)
    results["encode_s"] = time.perf_counter() - start
    results["table_rss_gb"] = resident_gb() - before
    prompt = tokenizer(leads[5000]["text"][:200], return_tensors="pt").input_ids[:, :32]
    texts = [d["text"] for d in corpus_split("wikipedia")[1][: args.texts]]
    per_step = {}
    for size in sorted(sizes, reverse=True):
        model.set_phrases(pool[:size], mid_sentence_forms=False)
        model.scorer = DotProductScorer()
        per_step[f"full_{size}"] = time_steps(model, prompt, args.steps, args.repeats)
        model.scorer = ShortlistScorer(model.phrase_table, config)
        rss, start = resident_gb(), time.perf_counter()
        model.scorer.fit(model.phrase_output_vectors())
        results[f"fit_s_{size}"] = time.perf_counter() - start
        head = model.scorer.head
        results[f"head_mb_{size}"] = sum(b.numel() * b.element_size() for b in head.buffers()) / 1e6
        results[f"head_rss_gb_{size}"] = resident_gb() - rss
        results[f"clusters_{size}"], results[f"subset_width_{size}"] = head.num_clusters, head.subsets.shape[1]
        per_step[f"shortlist_{size}"] = time_steps(model, prompt, args.steps, args.repeats)
        results[f"agreement_{size}"] = agreement(model, texts, [int(k) for k in args.probes.split(",")], args.max_tokens)
        head.config.probe = args.probe
        print(f"|P|={len(model.phrase_table)}: fit {results[f'fit_s_{size}']:.1f} s, m={head.num_clusters}, "
              f"head {results[f'head_mb_{size}']:.0f} MB; agreement {json.dumps(results[f'agreement_{size}'])}")
    model.set_phrases([])
    model.scorer = DotProductScorer()
    per_step["none"] = time_steps(model, prompt, args.steps, args.repeats)
    results["step_ms"] = {name: seconds * 1e3 for name, seconds in per_step.items()}
    results["step_ratio"] = {name: seconds / per_step["none"] for name, seconds in per_step.items()}
    for name, ratio in results["step_ratio"].items():
        print(f"per-step {name}: {per_step[name] * 1e3:.1f} ms = {ratio:.3f}x of |P|=0")
    print(f"extra memory of the {max(sizes)}-phrase bf16 table: {results['table_rss_gb']:.2f} GB (encoded in "
          f"{results['encode_s']:.0f} s); head tensors {results[f'head_mb_{max(sizes)}']:.0f} MB")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        Path(args.output).with_suffix(".md").write_text(markdown(results), encoding="utf-8")
    return results


def markdown(results: dict) -> str:
    """The benchmark's tables from its results."""
    sizes = sorted(int(k.removeprefix("fit_s_")) for k in results if k.startswith("fit_s_"))
    lines = ["# Shortlist head in DynamicVocabLM (SmolLM2-135M)", "", f"Settings: `{json.dumps(results['settings'])}`", "",
             "| per decoding step | ms | ratio to |P| = 0 |", "|---|---|---|"]
    for name, ms in results["step_ms"].items():
        lines.append(f"| {name} | {ms:.1f} | {results['step_ratio'][name]:.3f} |")
    for size in sizes:
        lines += ["", f"## |P| = {size}: fit {results[f'fit_s_{size}']:.0f} s, {results[f'clusters_{size}']} clusters, "
                      f"head tensors {results[f'head_mb_{size}']:.0f} MB", "",
                  "| probe k | argmax agreement | recall@10 | candidates per position | positions |", "|---|---|---|---|---|"]
        for k, row in results[f"agreement_{size}"].items():
            lines.append(f"| {k} | {row['agree']:.4f} | {row['recall10']:.4f} | {row['candidates']:.0f} | {row['positions']} |")
    lines += ["", f"Extra resident memory of the {max(sizes)}-phrase bf16 table: {results['table_rss_gb']:.2f} GB "
                  f"(encoding took {results['encode_s']:.0f} s)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
