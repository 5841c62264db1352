"""Benchmark of the loader's CPU kernels against torch's and transformers' own, on SmolLM2-135M.

``--compare linear``: linear layers on prepacked oneDNN weights (``dynvocab.hardware.packed_linear``) against torch's
``nn.Linear`` (MKL). ``--compare attention``: attention over grouped key/value heads as they are
(``dynvocab.hardware.attention``) against transformers' SDPA, which copies them out to every query head in a forward
over several tokens. Side by side in this one run, the same LM both ways (each round times both, in turn and in
reverse order every other round):
(a) a forward call over 1, 2, 3, 5 and 9 new tokens after ``--context-tokens`` cached ones (the read-back of a phrase
    or a draft of k - 1 tokens), one way against the other, and each against its own one-token call;
(b) greedy decoding after the first ``--prompt-chars`` characters of the last Wikipedia leads (``--lookup N``: with
    prompt lookup, whose every call verifies up to N drafted tokens), seconds per step;
(c) whether greedy decoding writes the same tokens both ways.

    python examples/benchmark_cpu_kernels.py --output results/request-path/packed-linear/figures.json
    python examples/benchmark_cpu_kernels.py --compare attention --context-tokens 800 --prompt-chars 4000 \
        --lookup 10 --output results/request-path/grouped-attention/figures.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from dynvocab import unpack_linear_layers
from dynvocab.data.assets import wikipedia_leads
from dynvocab.decoding.verification import forward_seconds
from dynvocab.loading import load_lm

LENGTHS = (1, 2, 3, 5, 9)


def cpu_name() -> str:
    """The CPU's model name and whether it has AVX-512 / AVX-512 BF16 / AMX (Linux)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    has = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if flag in flags]
    return f"{name} ({', '.join(has)})"


@torch.inference_mode()
def greedy(lm, prompt: torch.Tensor, steps: int, lookup: int = 0) -> tuple[float, list[int]]:
    """Seconds per step of ``steps`` greedy steps (the prompt's forward included; ``lookup`` > 0: prompt lookup
    drafting up to that many tokens a call) and the tokens written."""
    drafting = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    start = time.perf_counter()
    out = lm.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=steps, min_new_tokens=steps,
                      do_sample=False, **drafting)
    return (time.perf_counter() - start) / steps, out[0, prompt.shape[1] :].tolist()


def variants(model: str, compare: str) -> tuple[dict[str, torch.nn.Module], Any]:
    """The loader's LM and its copy on torch's or transformers' own kernel, by name (the loader's first), and the
    tokenizer."""
    loaded, tokenizer = load_lm(model)
    own = copy.deepcopy(loaded)
    if compare == "linear":
        unpack_linear_layers(own)
        return {"packed": loaded, "plain": own}, tokenizer
    own.set_attn_implementation("sdpa")
    return {"grouped": loaded, "sdpa": own}, tokenizer


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--compare", choices=("linear", "attention"), default="linear")
    parser.add_argument("--context-tokens", type=int, default=64, help="cached tokens before each timed forward")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of forward timings (each: 5 repeats per length)")
    parser.add_argument("--prompts", type=int, default=6, help="prompts (Wikipedia leads) decoded greedily both ways")
    parser.add_argument("--steps", type=int, default=32, help="greedy steps per prompt")
    parser.add_argument("--prompt-chars", type=int, default=200, help="characters of each lead in its prompt")
    parser.add_argument("--lookup", type=int, default=0, help="prompt lookup's drafted tokens a call (0: none)")
    parser.add_argument("--output", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    models, tokenizer = variants(args.model, args.compare)
    mine, own = models

    seconds: dict[str, dict[int, list[float]]] = {name: {n: [] for n in LENGTHS} for name in models}
    for round_ in range(args.rounds):
        for name in models if round_ % 2 else reversed(models):
            for n, value in forward_seconds(models[name], LENGTHS, args.context_tokens).items():
                seconds[name][n].append(value)
    forward = {name: {n: statistics.median(values) for n, values in by_n.items()} for name, by_n in seconds.items()}

    steps: dict[str, list[float]] = {name: [] for name in models}
    equal = 0
    leads = [lead["text"] for lead in wikipedia_leads()[-args.prompts :]]
    for index in range(args.prompts):  # a lead and, where it is shorter than --prompt-chars, the leads after it
        text = "\n\n".join(leads[index:] + leads[:index])[: args.prompt_chars]
        prompt = tokenizer(text, return_tensors="pt").input_ids
        written = {}
        for name in models if index % 2 else reversed(models):
            per_step, written[name] = greedy(models[name], prompt, args.steps, args.lookup)
            steps[name].append(per_step)
        equal += written[mine] == written[own]

    figures = {
        "machine": cpu_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "compared": f"{mine} over {own}",
        "context_tokens": args.context_tokens,
        "forward_ms": {name: {n: round(1e3 * s, 2) for n, s in by_n.items()} for name, by_n in forward.items()},
        f"forward_{mine}_over_{own}": {n: round(forward[mine][n] / forward[own][n], 3) for n in LENGTHS},
        "forward_over_one_token": {
            name: {n: round(by_n[n] / by_n[1], 3) for n in LENGTHS} for name, by_n in forward.items()
        },
        "greedy_ms_per_step": {name: round(1e3 * statistics.median(v), 2) for name, v in steps.items()},
        "greedy_lookup_tokens": args.lookup,
        f"greedy_{mine}_over_{own}": round(statistics.median(steps[mine]) / statistics.median(steps[own]), 3),
        "greedy_equal_tokens": f"{equal}/{args.prompts}",
    }
    print(json.dumps(figures, indent=1))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return figures


if __name__ == "__main__":
    main()
