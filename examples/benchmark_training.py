"""Benchmark of a training step on SmolLM2-135M (LoRA), measured side by side in one run.

Prints: the time of a plain LM training step on a batch, of the dynamic-vocabulary step
on the same batch with gold phrases only, and with all six negative sources; the
negatives' share of the plain step; peak resident memory; and what a resume costs
against loading the checkpoint alone.

    python examples/benchmark_training.py             # B=8 x 128 tokens, 2 threads
    python examples/benchmark_training.py --tiny      # smoke run
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dynvocab.training.collate import collate
from dynvocab.training.config import TrainConfig
from dynvocab.training.loss import dynamic_vocab_loss, next_item_loss
from dynvocab.training.trainer import Trainer, sample_stream

ALL_NEGATIVES = "in-batch,pre-batch,prefix,self-retrieval,corpus-retrieval,generation"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="B=2 x 32 tokens, one repeat")
    args = parser.parse_args(argv)
    if args.tiny:
        args.batch_size, args.max_length, args.repeats = 2, 32, 1
    torch.set_num_threads(args.threads)
    workdir = Path(tempfile.mkdtemp(prefix="dynvocab-bench-"))
    config = TrainConfig(
        model=args.model, output_dir=str(workdir), mode="lora", negatives=ALL_NEGATIVES,
        batch_size=args.batch_size, max_length=args.max_length, max_steps=1, save_every=1000,
    )
    trainer = Trainer(config)
    model, negatives = trainer.model, trainer.negatives
    samples = next(sample_stream(config, trainer.tokenizer, trainer.support))
    golds_only = collate(samples, [], model.vocab_size)
    params = [p for p in model.parameters() if p.requires_grad]

    def backward(loss: torch.Tensor) -> None:
        loss.backward()
        for p in params:
            p.grad = None

    def plain_step() -> None:
        logits = model.lm(input_ids=golds_only.token_ids, attention_mask=golds_only.token_mask).logits
        backward(next_item_loss(logits, golds_only.token_ids, golds_only.token_mask))

    def golds_step() -> None:
        backward(dynamic_vocab_loss(model, golds_only)["loss"])

    def negatives_step() -> None:
        backward(dynamic_vocab_loss(model, collate(samples, negatives(samples), model.vocab_size))["loss"])

    steps = {"plain LM step": plain_step, "dynvocab, gold phrases only": golds_step, "dynvocab, all six negatives": negatives_step}
    for step in steps.values():
        step()  # warm-up
    times = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            times[name].append(timed(step))
    median = {name: statistics.median(values) for name, values in times.items()}
    plain = median["plain LM step"]
    for name, seconds in median.items():
        print(f"{name:32s} {seconds:7.2f} s  ({seconds / plain:.2f}x the plain step)")
    extra = median["dynvocab, all six negatives"] - median["dynvocab, gold phrases only"]
    print(f"negatives add {extra:.2f} s = {100 * extra / plain:.0f}% of a plain LM step (target <= 30%); "
          f"{len(negatives(samples))} negatives for {len(golds_only.phrases)} gold phrases")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"peak resident memory: {peak:.2f} GB (target <= 8)")

    checkpoint = trainer.save_checkpoint()
    load_only = timed(lambda: trainer.load_checkpoint(checkpoint))
    trainer.before_training()  # the sample stream a resume skips ahead in
    resume = timed(trainer._resume)
    print(f"resume {resume:.2f} s vs loading the checkpoint alone {load_only:.2f} s")
    shutil.rmtree(workdir, ignore_errors=True)
    return {"plain_s": plain, "negatives_share": extra / plain, "peak_gb": peak, "resume_s": resume, "load_s": load_only}


if __name__ == "__main__":
    main()
