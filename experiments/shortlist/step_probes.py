"""Where a shortlist decoding step's time goes: the routing matmul warm and after a sweep of memory the size of the
LM's weights, in float16 and bfloat16, the scorer alone against the scorer inside ``generate``, and (``--ops``)
torch.profiler's operators by the self time per step that the shortlist adds to a step without phrases, and
(``--assembly``) the phrase half of a step alone, as the model builds its logits now against as it did before.

    python experiments/shortlist/step_probes.py --vectors-cache .cache/shortlist/vectors-1e6.safetensors \
        --output runs/shortlist-step-probes.json
    python experiments/shortlist/step_probes.py --vectors-cache .cache/shortlist/vectors-1e6.safetensors \
        --ops --size 1000000 --output runs/shortlist-ops.json
    python experiments/shortlist/step_probes.py --vectors-cache .cache/shortlist/vectors-1e6.safetensors \
        --assembly --size 1000000 --output runs/shortlist-assembly-1e6.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from dynvocab import DynamicVocabLM, ShortlistConfig, ShortlistScorer
from dynvocab.data.assets import wikipedia_leads
from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
from dynvocab.scoring.shortlist_head import ShortlistHead, _gathered_runs_torch
from dynvocab.scoring.shortlist_scorer import SCORER_DEFAULTS
from retrieval import extract_phrases


def median_ms(fn, repeats: int, before=None) -> float:
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def routing(clusters: list[int], dim: int = 576) -> dict:
    """ms of one query against ``m`` centroids, warm and after a 600 MB sweep (as an LM forward leaves the caches)."""
    sweep = torch.ones(150_000_000)
    figures = {}
    for m in clusters:
        centroids, query = torch.randn(m, dim), torch.randn(1, dim)
        for dtype in (torch.float16, torch.bfloat16):
            c, q = centroids.to(dtype), query.to(dtype)
            figures[f"{m} {str(dtype).removeprefix('torch.')}"] = {
                "warm_ms": median_ms(lambda: F.linear(q, c), 200),
                "cold_ms": median_ms(lambda: F.linear(q, c), 30, before=lambda: sweep.mul_(1.0)),
            }
    return figures


def shortlisted_model(size: int, cache: str):
    """SmolLM2 with the first ``size`` phrases of the benchmark's pool (vectors from its cache), the shortlist scorer,
    and a held-out prompt; phrases read back as one vector, as in the benchmark's timed steps."""
    model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    model.dynvocab_config.phrase_dtype, model.dynvocab_config.readback = "bfloat16", "vector"
    pool = extract_phrases(wikipedia_leads(), model.tokenizer, max_phrases=1_000_000)
    model.phrase_table.add(pool)
    model.restore_phrase_output_vectors(load_file(cache)["output"].clone())
    model.set_phrases(pool[:size], mid_sentence_forms=False)
    scorer = ShortlistScorer(model.phrase_table, ShortlistConfig(**SCORER_DEFAULTS, exact_below=size))
    model.scorer = scorer
    prompt = model.tokenizer(wikipedia_leads()[5000]["text"][:200], return_tensors="pt").input_ids[:, :32]
    return model, scorer, prompt


def op_profile(size: int, cache: str, steps: int = 32, top: int = 20) -> dict:
    """torch.profiler's operators, ms of self CPU time per decoding step, for ``generate`` with the shortlist and for
    the same LM without phrases; the ``top`` that the shortlist adds most to."""
    from torch.profiler import ProfilerActivity, profile

    model, _, prompt = shortlisted_model(size, cache)
    bare = DynamicVocabLM.from_causal_lm(model.lm, model.tokenizer).eval()
    per_step = {}
    for name, generator in (("bare", bare), ("shortlist", model)):
        generator.generate(prompt, max_new_tokens=4, do_sample=False, eos_token_id=None)  # warm-up (fits the head)
        with profile(activities=[ProfilerActivity.CPU]) as recorded:
            generator.generate(prompt, max_new_tokens=steps, do_sample=False, eos_token_id=None)
        per_step[name] = {event.key: event.self_cpu_time_total / 1e3 / steps for event in recorded.key_averages()}
    added = {key: ms - per_step["bare"].get(key, 0.0) for key, ms in per_step["shortlist"].items()}
    return {"phrases": size, "steps": steps,
            "total_ms": {name: sum(ops.values()) for name, ops in per_step.items()},
            "added_ms": dict(sorted(added.items(), key=lambda item: -item[1])[:top])}


def scorer_in_and_out_of_generate(size: int, cache: str, steps: int = 64) -> dict:
    """The shortlist scorer's ms per decoding step inside ``generate``, and the same calls replayed alone."""
    model, scorer, prompt = shortlisted_model(size, cache)
    model.generate(prompt, max_new_tokens=4, do_sample=False, eos_token_id=None)
    calls, seconds = [], []
    forward = type(scorer).forward

    def timed(self, hidden, vectors, mask=None):
        start = time.perf_counter()
        out = forward(self, hidden, vectors, mask)
        seconds.append(time.perf_counter() - start)
        calls.append(hidden.detach().clone())
        return out

    type(scorer).forward = timed
    try:
        model.generate(prompt, max_new_tokens=steps + 1, do_sample=False, eos_token_id=None)
    finally:
        type(scorer).forward = forward
    decoding = [s for s, h in zip(seconds, calls) if h.shape[1] == 1]
    vectors = model.phrase_output_vectors()
    with torch.no_grad():
        alone = [median_ms(lambda h=h: scorer(h, vectors), 5) for h in calls if h.shape[1] == 1]
    return {"phrases": size, "in_generate_ms": statistics.median(decoding) * 1e3, "alone_ms": statistics.median(alone)}


@torch.no_grad()
def logits_assembly(size: int, cache: str, positions: int = 64, repeats: int = 4) -> dict:
    """The phrase half of a decoding step, from the LM's last states to ``generate``'s argmax, at ``size`` phrases:
    ``DynamicVocabLM`` now (the candidates gathered in numpy, their scores written into the logits) against the code
    before (gathered by torch ops, scattered into a dense ``(1, 1, P)`` block, calibrated there and concatenated to
    the LM's logits), at phrase bias 0 and 2 (the pipeline calibrates). Each call starts from caches swept by a pass
    over 240 MB, as after an LM forward; the two run in turn on the states of ``positions`` held-out tokens,
    ``repeats`` times, and must pick the same id. Then the parts of the shortlist's own work, timed the same way."""
    model, scorer, _ = shortlisted_model(size, cache)
    seen = []
    hook = model.lm.get_output_embeddings().register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0]))
    model.lm(model.tokenizer(wikipedia_leads()[5001]["text"], return_tensors="pt").input_ids[:, :positions])
    hook.remove()
    states = seen[0][0]  # (T, d)
    lm_logits = model.lm.get_output_embeddings()(states)[:, None]  # (T, 1, V)
    vectors = model.phrase_output_vectors()
    scorer(states[:1, None], vectors)  # fits the head
    head, sweep = scorer.head, torch.ones(60_000_000)
    numpy_gather = ShortlistHead._gathered

    def torch_gather(head, nearest):
        return _gathered_runs_torch(*head._runs(), nearest, head.vocab_size)

    def before(t: int) -> torch.Tensor:
        ShortlistHead._gathered = torch_gather
        try:
            dense = model._calibrated(scorer(states[t : t + 1, None], vectors))
        finally:
            ShortlistHead._gathered = numpy_gather
        return torch.cat([lm_logits[t : t + 1], dense.to(lm_logits.dtype)], dim=-1)

    def now(t: int) -> torch.Tensor:
        return model._with_phrase_scores(lm_logits[t : t + 1], states[t : t + 1, None], vectors, None)

    figures = {"phrases": size, "clusters": head.num_clusters, "calls": positions * repeats, "assembly": []}
    for bias in (0.0, 2.0):
        model.dynvocab_config.phrase_score_bias = bias
        seconds: dict[str, list[float]] = {"before": [], "now": []}
        for repeat in range(repeats):
            for t in range(states.shape[0]):
                chosen = {}
                turns = (("before", before), ("now", now))
                for name, build in turns if (t + repeat) % 2 else turns[::-1]:
                    sweep.mul_(1.0)
                    start = time.perf_counter()
                    chosen[name] = int(build(t)[:, -1, :].to(copy=True, dtype=torch.float32).argmax(-1))
                    seconds[name].append(time.perf_counter() - start)
                if chosen["before"] != chosen["now"]:
                    raise RuntimeError(f"position {t}: the two assemblies chose {chosen}")
        saved = statistics.median(b - n for b, n in zip(seconds["before"], seconds["now"])) * 1e3
        medians = {f"{name}_ms": statistics.median(values) * 1e3 for name, values in seconds.items()}
        figures["assembly"].append({"bias": bias, **medians, "saved_ms": saved})
    parts: dict[str, list[float]] = {name: [] for name in ("route", "topk", "gather", "index_select", "bmm")}
    widths = []
    for _ in range(repeats):
        for query in states:
            sweep.mul_(1.0)
            steps = (("route", lambda: head.route(query[None])),
                     ("topk", lambda: found.topk(head.config.probe).indices),
                     ("gather", lambda: head._gathered(found)),
                     ("index_select", lambda: vectors.index_select(0, found[0])),
                     ("bmm", lambda: torch.bmm(query[None, None].to(found.dtype), found[None].transpose(1, 2))))
            for name, step in steps:
                start = time.perf_counter()
                found = step()
                parts[name].append(time.perf_counter() - start)
            widths.append(found.shape[-1])
    figures["parts_ms"] = {name: statistics.median(values) * 1e3 for name, values in parts.items()}
    figures["candidates"] = statistics.median(widths)
    return figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors-cache", required=True, help="benchmark_shortlist.py's phrase vectors")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--ops", action="store_true", help="only the operator profile of a step, at --size phrases")
    parser.add_argument("--assembly", action="store_true", help="only the phrase half of a step, now against before, "
                        "at --size phrases, with phrase bias 0 and 2")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    if args.ops:
        figures = {"operators": op_profile(args.size, args.vectors_cache)}
    elif args.assembly:
        figures = {"assembly": logits_assembly(args.size, args.vectors_cache)}
    else:
        figures = {"routing": routing([10_601, 28_455]),
                   "scorer": scorer_in_and_out_of_generate(args.size, args.vectors_cache)}
    args.output.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
