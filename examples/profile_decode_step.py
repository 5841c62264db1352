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

    python examples/profile_decode_step.py --num-prompts 8 --output results/request-path/decode-profile/profile.txt

``--state-threshold T`` puts the state gate (``dynvocab.states.keys``) on the dynamic model's steps, keyed by each
prompt's retrieved documents, and times making the keys: the LM's pass over the documents, the first time and
again from the kept states.

On a GPU, or any machine without the demo's index: save the prompts' phrases where the index is
(``--save-phrases phrases.json``), then time there from that file (``--phrases phrases.json --device cuda``).
``--random-lm`` builds the LM from its config with random weights, for a machine that has its config and
tokenizer but not its weights: a step's cost does not depend on the weights' values, and with the phrases'
bias at -1e4 both models write the same tokens whatever they are.
"""

from __future__ import annotations

import argparse
import collections
import copy
import cProfile
import io
import json
import pstats
import statistics
import time
import warnings
from pathlib import Path

import torch

TARGET = 1.05
READBACK_TARGET = 1.0


def clock(device: torch.device) -> float:
    """``time.perf_counter()`` once the device has finished its queued work (a GPU runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def readback_pairs(model, ids: torch.Tensor, phrase_ids: list[int], repeats: int) -> list[tuple[int, float, float]]:
    """``(k, dynamic s, bare s)`` per phrase and repeat: the step after emitting phrase ``id`` against the bare LM's
    forward over its ``k`` tokens, both from a copy of the same prompt's cache."""
    from transformers import DynamicCache

    device = ids.device
    ones = torch.ones_like(ids)
    dynamic_cache = model(**model.prepare_inputs_for_generation(ids, past_key_values=DynamicCache(), attention_mask=ones,
                                                                use_cache=True)).past_key_values
    bare_cache = model.lm(input_ids=ids, attention_mask=ones, use_cache=True).past_key_values
    pairs = []
    for phrase_id in phrase_ids:
        tokens = torch.tensor([model.phrase_table.token_ids[phrase_id - model.vocab_size]], device=device)
        logical = torch.cat([ids, torch.tensor([[phrase_id]], device=device)], dim=1)
        physical_mask = torch.ones(1, ids.shape[1] + tokens.shape[1], dtype=torch.long, device=device)
        for repeat in range(repeats):
            timed = {}
            for name in ("dynamic", "bare") if repeat % 2 == 0 else ("bare", "dynamic"):  # neither always goes first
                cache = copy.deepcopy(dynamic_cache if name == "dynamic" else bare_cache)
                start = clock(device)
                if name == "dynamic":
                    model(**model.prepare_inputs_for_generation(logical, past_key_values=cache, logits_to_keep=1,
                                                                attention_mask=torch.ones_like(logical), use_cache=True))
                else:
                    model.lm(input_ids=tokens, attention_mask=physical_mask, past_key_values=cache, use_cache=True,
                             logits_to_keep=1)
                timed[name] = clock(device) - start
            pairs.append((tokens.shape[1], timed["dynamic"], timed["bare"]))
    return pairs


def sync_sites(generate, ids: torch.Tensor, kwargs: dict, steps: int) -> collections.Counter:
    """Where one CUDA generation waits for the GPU: ``file:line`` of each synchronizing call (torch's sync debug mode),
    counted over ``steps`` steps."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            generate(ids, max_new_tokens=steps, min_new_tokens=steps, **kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return collections.Counter(f"{Path(w.filename).parent.name}/{Path(w.filename).name}:{w.lineno}" for w in caught
                               if "synchronizing" in str(w.message))


def sync_lines(sites: dict[str, collections.Counter], steps: int) -> list[str]:
    """The synchronizing calls per step of each model, and the places where the dynamic model adds some."""
    lines = [f"\nHost-device synchronisations per step (torch.cuda sync debug mode, one prompt, {steps} steps): "
             + ", ".join(f"{name} {sum(counts.values()) / steps:.2f}" for name, counts in sites.items())]
    added = sites["dynamic"] - sites["bare"]
    lines += [f"  +{count / steps:.2f} per step  {site}" for site, count in added.most_common(10)]
    return lines


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


def _dynamic_model(lm_name: str, random_lm: bool, linear: str):
    """The LM with the shipped phrase encoder; its linear layers packed (the library's loader) or torch's own."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from dynvocab import DynamicVocabLM, pack_linear_layers, unpack_linear_layers
    from dynvocab.data.assets import resolve_model
    from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm

    if random_lm:
        path = resolve_model(lm_name)
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32).eval()
        pack_linear_layers(lm)
        model = DynamicVocabLM.from_pretrained(SHIPPED_ENCODER, lm, AutoTokenizer.from_pretrained(path)).eval()
    else:
        model = load_dynamic_lm(lm_name, SHIPPED_ENCODER)
    if linear == "plain":
        unpack_linear_layers(model.lm)
    return model


def _retrieved_phrases(model, workdir: Path, num_prompts: int) -> tuple[list[str], list[list[str]], dict, list]:
    """The first held-out Wikipedia leads cut to 32 tokens, the phrases the pipeline retrieves for each, its
    ``generate`` settings (with the phrases' bias at -1e4) and each prompt's documents."""
    from dynvocab.data.corpora import corpus_split
    from retrieval.config import PipelineConfig
    from retrieval.loading import demo_index
    from retrieval.pipeline import PhrasePipeline

    pipeline = PhrasePipeline(model, demo_index(workdir, "wikipedia"), PipelineConfig(phrase_bias=-1e4))
    tokenizer = model.tokenizer
    leads = [lead for lead in corpus_split("wikipedia")[1] if len(tokenizer(lead["text"]).input_ids) > 32]
    prompts = [tokenizer.decode(tokenizer(lead["text"]).input_ids[:32]) for lead in leads[:num_prompts]]
    documents = pipeline.index.search_documents(prompts, k=pipeline.config.top_k)
    phrases = [[phrase.text for phrase in pipeline.candidates(found)] for found in documents]
    return prompts, phrases, pipeline.config.generation_kwargs(), documents


class _StateGate:
    """Each prompt's state keys, with the time to make them from unread documents and again from the kept states."""

    def __init__(self, model, threshold: float) -> None:
        from dynvocab.states.store import DocumentStates

        self.model, self.threshold = model, threshold
        self.states = DocumentStates(model.lm)
        self.seconds: dict[str, list[float]] = {"first": [], "again": []}
        self.counts: list[tuple[int, int]] = []  # (documents' tokens, keys) per prompt

    def keys(self, documents: list[dict]):
        from dynvocab.states.keys import state_keys
        from retrieval.document_states import document_token_ids

        ids = document_token_ids(self.model.tokenizer, documents)
        device = next(self.model.parameters()).device
        for when in ("first", "again"):
            start = clock(device)
            keys = state_keys(self.states, ids, self.model.phrase_table.token_ids, self.threshold)
            self.seconds[when].append(clock(device) - start)
        self.counts.append((sum(min(len(i), self.states.max_tokens) for i in ids), keys.keys.shape[0]))
        return keys

    def lines(self) -> list[str]:
        tokens, keys = (statistics.median(c[n] for c in self.counts) for n in (0, 1))
        first, again = (statistics.median(self.seconds[when]) for when in ("first", "again"))
        return [f"\nState keys per prompt (medians): {keys:.0f} keys from {tokens:.0f} document tokens; made in "
                f"{first:.2f} s the first time (the LM reads the documents no earlier prompt retrieved), in "
                f"{again:.3f} s again from the kept states"]


def _where(device: torch.device, linear: str, random_lm: bool) -> str:
    """The machine and settings a figure was measured on, for the summary's first line."""
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"CPU, {torch.get_num_threads()} threads, {linear} linear layers")
    return where + (", random LM weights" if random_lm else "")


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
    parser.add_argument("--device", default="cpu", help="where both models run: cpu, cuda, cuda:1, ...")
    parser.add_argument("--phrases", help="read the prompts and their phrases from this file (--save-phrases) "
                                          "instead of retrieving them from the demo's index")
    parser.add_argument("--save-phrases", help="write the prompts and their retrieved phrases to this file")
    parser.add_argument("--random-lm", action="store_true",
                        help="the LM from its config with random weights (timings only; see above)")
    parser.add_argument("--lm", default="smollm2", help="the LM: Hub name, path or offline alias")
    parser.add_argument("--state-threshold", type=float,
                        help="the state gate on the dynamic model's steps at this cosine (keys from the documents)")
    parser.add_argument("--output", help="also write the printed summary here")
    args = parser.parse_args(argv)
    if args.phrases and args.save_phrases:
        parser.error("--phrases reads saved phrases and --save-phrases writes retrieved ones: pass one of them")
    if args.phrases and args.state_threshold is not None:
        parser.error("--state-threshold keys phrases by their documents, which --phrases files do not hold: retrieve "
                     "them (leave --phrases out)")

    model = _dynamic_model(args.lm, args.random_lm, args.linear)
    device = torch.device(args.device)
    model.to(device)
    tokenizer = model.tokenizer
    if args.phrases:
        saved = json.loads(Path(args.phrases).read_text(encoding="utf-8"))
        prompts, phrase_sets, settings = saved["prompts"][: args.num_prompts], saved["phrases"], saved["settings"]
    else:
        prompts, phrase_sets, settings, documents = _retrieved_phrases(model, Path(args.workdir), args.num_prompts)
    gate = _StateGate(model, args.state_threshold) if args.state_threshold is not None else None
    if args.save_phrases:
        saved = {"prompts": prompts, "phrases": phrase_sets, "settings": settings}
        Path(args.save_phrases).write_text(json.dumps(saved), encoding="utf-8")
    from dynvocab.loading import freeze_loaded_objects

    freeze_loaded_objects()  # as the library's commands do: no full garbage collection over the loaded stack in a step
    bare_settings = {"do_sample": False, "no_repeat_ngram_size": settings.get("no_repeat_ngram_size", 0)}
    per_step: dict[str, list[float]] = {"bare": [], "dynamic": []}
    profiles = {"bare": cProfile.Profile(), "dynamic": cProfile.Profile()}
    phrases, differ, pairs = 0, 0, []
    with torch.no_grad():
        for index, (prompt, found) in enumerate(zip(prompts, phrase_sets)):
            model.set_phrases(found, mid_sentence_forms=False)
            phrases += len(found)
            keyed = {"phrase_state_keys": gate.keys(documents[index])} if gate is not None else {}
            ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
            outputs = {}
            for name in ("bare", "dynamic") if index % 2 == 0 else ("dynamic", "bare"):  # neither always first
                generate = model.lm.generate if name == "bare" else model.generate
                kwargs = bare_settings if name == "bare" else settings | keyed
                start = clock(device)  # timed without the profiler, which slows Python calls, not the LM
                out = generate(ids, max_new_tokens=args.steps, min_new_tokens=args.steps, **kwargs)
                per_step[name].append((clock(device) - start) / (out.shape[1] - ids.shape[1]))
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
        f"{_where(device, args.linear, args.random_lm)}; the dynamic model wrote the bare LM's tokens on "
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
    if gate is not None:
        lines[0] += f"; state gate at {args.state_threshold} on the dynamic model's steps"
        extra += gate.lines()
    if device.type == "cuda":
        ids = tokenizer(prompts[0], return_tensors="pt").input_ids.to(device)
        model.set_phrases(phrase_sets[0], mid_sentence_forms=False)
        extra += sync_lines({"bare": sync_sites(model.lm.generate, ids, bare_settings, args.steps),
                             "dynamic": sync_sites(model.generate, ids, settings, args.steps)}, args.steps)
    text = "\n".join(lines + extra)
    print(text)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return {"bare_s": bare, "dynamic_s": dynamic, "ratio": dynamic / bare, "differ": differ, "readback_ratio": readback}


if __name__ == "__main__":
    main()
