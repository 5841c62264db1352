"""Where a decoding step's time goes: the dynamic model with a prompt's phrases against the bare LM, paired.

Both decode the same prompts greedily with the pipeline's safeguards (``no_repeat_ngram_size``; the dynamic model
also with its phrase rules). The dynamic model's phrases get a bias of -1e4, so it emits none and writes exactly
the bare LM's tokens: what is left is the cost of carrying the phrases. The two run in turn on each prompt, so a
busy machine slows both alike. Prints the median time per step and the ratio (target: at most 1.05), then the
functions whose own time per step grows most from the bare LM to the dynamic model (cProfile of both).

    python examples/profile_decode_step.py --num-prompts 8 --output results/decode-profile/profile.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path

import torch

TARGET = 1.05


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=8, help="held-out prompts decoded by each model")
    parser.add_argument("--steps", type=int, default=64, help="decoding steps per prompt")
    parser.add_argument("--top", type=int, default=25, help="functions listed from the profile")
    parser.add_argument("--workdir", default=".cache/demo", help="where `make demo` keeps its index")
    parser.add_argument("--output", help="also write the printed summary here")
    args = parser.parse_args(argv)

    from dynvocab.corpora import corpus_split
    from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
    from retrieval.loading import demo_index
    from retrieval.pipeline import PhrasePipeline, PipelineConfig

    model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    pipeline = PhrasePipeline(model, demo_index(Path(args.workdir), "wikipedia"), PipelineConfig(phrase_bias=-1e4))
    tokenizer = model.tokenizer
    leads = [lead for lead in corpus_split("wikipedia")[1] if len(tokenizer(lead["text"]).input_ids) > 32]
    prompts = [tokenizer.decode(tokenizer(lead["text"]).input_ids[:32]) for lead in leads[: args.num_prompts]]
    settings = pipeline.config.generation_kwargs()
    bare_settings = {"do_sample": False, "no_repeat_ngram_size": pipeline.config.no_repeat_ngram_size}
    per_step: dict[str, list[float]] = {"bare": [], "dynamic": []}
    profiles = {"bare": cProfile.Profile(), "dynamic": cProfile.Profile()}
    phrases, differ = 0, 0
    with torch.no_grad():
        for prompt in prompts:
            found = pipeline.candidates(pipeline.index.search_documents([prompt], k=pipeline.config.top_k)[0])
            model.set_phrases(found, mid_sentence_forms=False)
            phrases += len(found)
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            outputs = {}
            for name in ("bare", "dynamic"):
                generate = model.lm.generate if name == "bare" else model.generate
                start = time.perf_counter()
                profiles[name].enable()
                out = generate(ids, max_new_tokens=args.steps, min_new_tokens=args.steps,
                               **(bare_settings if name == "bare" else settings))
                profiles[name].disable()
                per_step[name].append((time.perf_counter() - start) / (out.shape[1] - ids.shape[1]))
                outputs[name] = out[0].tolist()
                if name == "dynamic" and int((out >= model.vocab_size).sum()):
                    raise RuntimeError("a phrase was emitted although its bias is -1e4: the comparison is off")
            differ += outputs["bare"] != outputs["dynamic"]

    bare, dynamic = (statistics.median(per_step[n]) for n in ("bare", "dynamic"))
    steps = len(prompts) * args.steps
    lines = [
        f"{len(prompts)} held-out prompts x {args.steps} steps, {phrases / len(prompts):.0f} phrases per prompt, "
        f"{torch.get_num_threads()} threads; the dynamic model wrote the bare LM's tokens on "
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
    text = "\n".join(lines)
    print(text)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return {"bare_s": bare, "dynamic_s": dynamic, "ratio": dynamic / bare, "differ": differ}


if __name__ == "__main__":
    main()
