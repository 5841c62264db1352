"""Training speed: the cached-state trainer (readback=tokens, frozen LM) against the vector-read-back trainer.

Both train the phrase encoder of the frozen SmolLM2-135M at the same batch size, sequence
length and negatives; their steps are timed in turn in one run (one step of each, then the
next), so a busy machine slows both alike. Prints the median seconds per step, steps and
training tokens per second, and the ratio against the target (at least 20x).

    python examples/benchmark_cached_training.py --state-cache .cache/states/smollm2-wikipedia-128
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from dynvocab.training.config import TrainConfig
from dynvocab.training.trainer import Trainer

TARGET = 20.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--state-cache", required=True, help="a cache of --model over the training split (its finished "
                                                              "shards suffice: a step's cost does not depend on how many)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--negatives", default=TrainConfig.negatives, help="the same for both (default: train's own)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each trainer, after one warm-up step")
    parser.add_argument("--output", help="also write the figures as JSON here")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="dynvocab-bench-"))
    common = dict(model=args.model, mode="frozen", batch_size=args.batch_size, max_length=args.max_length,
                  negatives=args.negatives, max_steps=10**6, save_every=10**6)
    trainers = {
        "vector read-back (runs the LM)": Trainer(TrainConfig(readback="vector", output_dir=str(workdir / "vector"), **common)),
        "token read-back from the cache": Trainer(TrainConfig(readback="tokens", state_cache=args.state_cache,
                                                              incomplete_cache=True, output_dir=str(workdir / "cached"),
                                                              **common)),
    }
    for trainer in trainers.values():
        trainer.before_training()  # its sample stream
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    tokens: dict[str, list[int]] = {name: [] for name in trainers}
    for repeat in range(args.steps + 1):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            terms = trainer.train_step()
            if repeat:  # the first step of each is a warm-up
                seconds[name].append(time.perf_counter() - start)
                tokens[name].append(terms["tokens"])
    median = {name: statistics.median(values) for name, values in seconds.items()}
    vector, cached = median.values()
    ratio = vector / cached
    lines = [f"command: python {' '.join(sys.argv)}",
             f"batch {args.batch_size} x {args.max_length} tokens, negatives {args.negatives}, {args.steps} timed steps each, "
             f"{torch.get_num_threads()} threads, torch {torch.__version__}, {platform.machine()}"]
    for name in trainers:
        per_second = sum(tokens[name]) / sum(seconds[name])
        lines.append(f"{name:32s} {median[name]:7.3f} s/step  {1 / median[name]:6.2f} steps/s  {per_second:8.0f} tokens/s")
    verdict = "met" if ratio >= TARGET else f"missed by {TARGET - ratio:.1f}x"
    lines.append(f"cached trainer: {ratio:.1f}x the steps per second of the vector trainer (target >= {TARGET:.0f}x: {verdict})")
    print("\n".join(lines))
    figures = {"seconds_per_step": median, "ratio": ratio, "target": TARGET, "lines": lines}
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    main()
