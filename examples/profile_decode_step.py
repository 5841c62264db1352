"""Where a decoding step's time goes: the dynamic model with a prompt's phrases against the bare LM, paired.

Both decode the same prompts greedily with the pipeline's safeguards (``no_repeat_ngram_size``; the dynamic model
also with its phrase rules). The dynamic model's phrases get a bias of -1e4, so it emits none and writes exactly
the bare LM's tokens: what is left is the cost of carrying the phrases. The two run in turn on each prompt, so a
busy machine slows both alike. Prints the median time per step and the ratio (target: at most 1.05), then the
functions whose own time per step grows most from the bare LM to the dynamic model (cProfile of both, in a second
run of each prompt: the profiler slows Python calls, so the timed run goes without it).

Then the read-back: after each prompt, the step that follows an emitted phrase of ``k`` tokens (the dynamic model's
``prepare_inputs_for_generation`` and forward, which feed the phrase's ``k`` tokens at once and score every
phrase) against the bare LM's forward over the same ``k`` tokens from the same cache, both keeping the last
position's logits as ``generate`` does, timed in turn, each first every other time (target: at most 1.0x, i.e. no more than the bare LM's
forward over ``k`` tokens).

    python examples/profile_decode_step.py --num-prompts 8 --output results/decode-profile/profile.txt
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path

import torch

TARGET = 1.05
READBACK_TARGET = 1.0


@torch.no_grad()
def readback_pairs(model, ids: torch.Tensor, phrase_ids: list[int], repeats: int) -> list[tuple[int, float, float]]:
    """``(k, dynamic s, bare s)`` per phrase and repeat: the step after emitting phrase ``id`` against the bare LM's
    forward over its ``k`` tokens, both from a copy of the same prompt's cache."""
    from transformers import DynamicCache

    ones = torch.ones_like(ids)
    dynamic_cache = model(**model.prepare_inputs_for_generation(ids, past_key_values=DynamicCache(), attention_mask=ones,
                                                                use_cache=True)).past_key_values
    bare_cache = model.lm(input_ids=ids, attention_mask=ones, use_cache=True).past_key_values
    pairs = []
    for phrase_id in phrase_ids:
        tokens = torch.tensor([model.phrase_table.token_ids[phrase_id - model.vocab_size]])
        logical = torch.cat([ids, torch.tensor([[phrase_id]])], dim=1)
        physical_mask = torch.ones(1, ids.shape[1] + tokens.shape[1], dtype=torch.long)
        for repeat in range(repeats):
            timed = {}
            for name in ("dynamic", "bare") if repeat % 2 == 0 else ("bare", "dynamic"):  # neither always goes first
                cache = copy.deepcopy(dynamic_cache if name == "dynamic" else bare_cache)
                start = time.perf_counter()
                if name == "dynamic":
                    model(**model.prepare_inputs_for_generation(logical, past_key_values=cache, logits_to_keep=1,
                                                                attention_mask=torch.ones_like(logical), use_cache=True))
                else:
                    model.lm(input_ids=tokens, attention_mask=physical_mask, past_key_values=cache, use_cache=True,
                             logits_to_keep=1)
                timed[name] = time.perf_counter() - start
            pairs.append((tokens.shape[1], timed["dynamic"], timed["bare"]))
    return pairs


def readback_lines(pairs: list[tuple[int, float, float]]) -> tuple[list[str], float]:
    """The read-back table (median ratio per phrase length ``k``) and the median ratio over all pairs."""
    lines = ["\nRead-back: the step after an emitted k-token phrase against the bare LM's forward over its k tokens "
             "(paired, same cache):", "| k | pairs | dynamic ms (median) | bare ms (median) | ratio (median of pairs) |",
             "|---|---|---|---|---|"]
    for k in sorted({k for k, _, _ in pairs}):
        chosen = [(d, b) for length, d, b in pairs if length == k]
        lines.append(f"| {k} | {len(chosen)} | {1e3 * statistics.median(d for d, _ in chosen):.2f} | "
                     f"{1e3 * statistics.median(b for _, b in chosen):.2f} | "
                     f"{statistics.median(d / b for d, b in chosen):.3f} |")
    overall = statistics.median(d / b for _, d, b in pairs)
    verdict = "met" if overall <= READBACK_TARGET else f"missed by {overall - READBACK_TARGET:.3f}"
    lines.append(f"read-back / bare forward over k tokens, all pairs: {overall:.3f} (target <= {READBACK_TARGET}: {verdict})")
    return lines, overall


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=8, help="held-out prompts decoded by each model")
    parser.add_argument("--steps", type=int, default=64, help="decoding steps per prompt")
    parser.add_argument("--top", type=int, default=25, help="functions listed from the profile")
    parser.add_argument("--readback-phrases", type=int, default=8, help="phrases per prompt timed for the read-back")
    parser.add_argument("--readback-repeats", type=int, default=4, help="paired timings per phrase")
    parser.add_argument("--workdir", default=".cache/demo", help="where `make demo` keeps its index")
    parser.add_argument("--linear", choices=("packed", "plain"), default="packed",
                        help="the LM's linear layers: prepacked for oneDNN (the library's loader) or torch's own")
    parser.add_argument("--output", help="also write the printed summary here")
    args = parser.parse_args(argv)

    from dynvocab import unpack_linear_layers
    from dynvocab.corpora import corpus_split
    from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
    from retrieval.loading import demo_index
    from retrieval.pipeline import PhrasePipeline, PipelineConfig

    model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    if args.linear == "plain":
        unpack_linear_layers(model.lm)
    pipeline = PhrasePipeline(model, demo_index(Path(args.workdir), "wikipedia"), PipelineConfig(phrase_bias=-1e4))
    tokenizer = model.tokenizer
    leads = [lead for lead in corpus_split("wikipedia")[1] if len(tokenizer(lead["text"]).input_ids) > 32]
    prompts = [tokenizer.decode(tokenizer(lead["text"]).input_ids[:32]) for lead in leads[: args.num_prompts]]
    settings = pipeline.config.generation_kwargs()
    bare_settings = {"do_sample": False, "no_repeat_ngram_size": pipeline.config.no_repeat_ngram_size}
    per_step: dict[str, list[float]] = {"bare": [], "dynamic": []}
    profiles = {"bare": cProfile.Profile(), "dynamic": cProfile.Profile()}
    phrases, differ, pairs = 0, 0, []
    with torch.no_grad():
        for index, prompt in enumerate(prompts):
            found = pipeline.candidates(pipeline.index.search_documents([prompt], k=pipeline.config.top_k)[0])
            model.set_phrases(found, mid_sentence_forms=False)
            phrases += len(found)
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            outputs = {}
            for name in ("bare", "dynamic") if index % 2 == 0 else ("dynamic", "bare"):  # neither always first
                generate = model.lm.generate if name == "bare" else model.generate
                kwargs = bare_settings if name == "bare" else settings
                start = time.perf_counter()  # timed without the profiler, which slows Python calls, not the LM
                out = generate(ids, max_new_tokens=args.steps, min_new_tokens=args.steps, **kwargs)
                per_step[name].append((time.perf_counter() - start) / (out.shape[1] - ids.shape[1]))
                profiles[name].enable()
                generate(ids, max_new_tokens=args.steps, min_new_tokens=args.steps, **kwargs)
                profiles[name].disable()
                outputs[name] = out[0].tolist()
                if name == "dynamic" and int((out >= model.vocab_size).sum()):
                    raise RuntimeError("a phrase was emitted although its bias is -1e4: the comparison is off")
            differ += outputs["bare"] != outputs["dynamic"]
            spread = range(0, len(found), max(1, len(found) // args.readback_phrases))  # phrases across the ranking
            chosen = [model.vocab_size + i for i in spread][: args.readback_phrases]
            pairs += readback_pairs(model, ids, chosen, args.readback_repeats)

    bare, dynamic = (statistics.median(per_step[n]) for n in ("bare", "dynamic"))
    steps = len(prompts) * args.steps
    lines = [
        f"{len(prompts)} held-out prompts x {args.steps} steps, {phrases / len(prompts):.0f} phrases per prompt, "
        f"{torch.get_num_threads()} threads, {args.linear} linear layers; the dynamic model wrote the bare LM's tokens on "
        f"{len(prompts) - differ} of {len(prompts)} prompts",
        f"bare LM step: median {1e3 * bare:.2f} ms; dynamic step, no phrase emitted: median {1e3 * dynamic:.2f} ms",
        f"dynamic / bare: {dynamic / bare:.3f} (target <= {TARGET}: {'met' if dynamic / bare <= TARGET else 'missed'})",
        f"\nFunctions by the own time per step they add to a bare step (cProfile of both; {steps} steps each):",
    ]
    own = {name: {key: value[2] / steps for key, value in pstats.Stats(profile, stream=io.StringIO()).stats.items()}
           for name, profile in profiles.items()}
    calls = pstats.Stats(profiles["dynamic"], stream=io.StringIO()).stats
    added = sorted(own["dynamic"], key=lambda key: own["bare"].get(key, 0.0) - own["dynamic"][key])[: args.top]
    for key in added:
        file, line, function = key
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        extra = own["dynamic"][key] - own["bare"].get(key, 0.0)
        lines.append(f"{1e3 * extra:+8.3f} ms ({1e3 * own['dynamic'][key]:7.3f} ms own, {calls[key][1] / steps:6.1f} calls)"
                     f"  {function} ({where})")
    extra, readback = readback_lines(pairs)
    text = "\n".join(lines + extra)
    print(text)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return {"bare_s": bare, "dynamic_s": dynamic, "ratio": dynamic / bare, "differ": differ, "readback_ratio": readback}


if __name__ == "__main__":
    main()
