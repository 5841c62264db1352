"""Benchmark of prepacked linear layers (``dynvocab.hardware.packed_linear``) against torch's own, on SmolLM2-135M.

Side by side in this one run, the same LM with its linear layers packed and plain (each round times both, in turn
and in reverse order every other round):
(a) a forward call over 1, 2, 3, 5 and 9 new tokens after 64 cached ones (the read-back of a phrase or a draft of
    k - 1 tokens), packed against plain, and each against its own one-token call;
(b) greedy decoding after the first 200 characters of the last Wikipedia leads, seconds per step;
(c) whether greedy decoding writes the same tokens both ways.

    python examples/benchmark_packed_linear.py --output results/request-path/packed-linear/figures.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path

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
def greedy(lm, prompt: torch.Tensor, steps: int) -> tuple[float, list[int]]:
    """Seconds per step of ``steps`` greedy steps (the prompt's forward included) and the tokens written."""
    start = time.perf_counter()
    out = lm.generate(prompt, max_new_tokens=steps, do_sample=False, eos_token_id=None)
    return (time.perf_counter() - start) / steps, out[0, prompt.shape[1] :].tolist()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of forward timings (each: 5 repeats per length)")
    parser.add_argument("--prompts", type=int, default=6, help="prompts (Wikipedia leads) decoded greedily both ways")
    parser.add_argument("--steps", type=int, default=32, help="greedy steps per prompt")
    parser.add_argument("--output", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    packed, tokenizer = load_lm(args.model)
    plain = copy.deepcopy(packed)
    unpack_linear_layers(plain)
    models = {"packed": packed, "plain": plain}

    seconds: dict[str, dict[int, list[float]]] = {name: {n: [] for n in LENGTHS} for name in models}
    for round_ in range(args.rounds):
        for name in models if round_ % 2 else reversed(models):
            for n, value in forward_seconds(models[name], LENGTHS).items():
                seconds[name][n].append(value)
    forward = {name: {n: statistics.median(values) for n, values in by_n.items()} for name, by_n in seconds.items()}

    steps: dict[str, list[float]] = {name: [] for name in models}
    equal = 0
    for index, lead in enumerate(wikipedia_leads()[-args.prompts :]):
        prompt = tokenizer(lead["text"][:200], return_tensors="pt").input_ids
        written = {}
        for name in models if index % 2 else reversed(models):
            per_step, written[name] = greedy(models[name], prompt, args.steps)
            steps[name].append(per_step)
        equal += written["packed"] == written["plain"]

    figures = {
        "machine": cpu_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "forward_ms": {name: {n: round(1e3 * s, 2) for n, s in by_n.items()} for name, by_n in forward.items()},
        "forward_packed_over_plain": {n: round(forward["packed"][n] / forward["plain"][n], 3) for n in LENGTHS},
        "forward_over_one_token": {
            name: {n: round(by_n[n] / by_n[1], 3) for n in LENGTHS} for name, by_n in forward.items()
        },
        "greedy_ms_per_step": {name: round(1e3 * statistics.median(v), 2) for name, v in steps.items()},
        "greedy_packed_over_plain": round(statistics.median(steps["packed"]) / statistics.median(steps["plain"]), 3),
        "greedy_equal_tokens": f"{equal}/{args.prompts}",
    }
    print(json.dumps(figures, indent=1))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return figures


if __name__ == "__main__":
    main()
