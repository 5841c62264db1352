"""Kill -9 at random moments during ``save_pretrained``, an index save and training; check what survives.

Each trial runs the writer in a subprocess that saves over and over (or trains with a
checkpoint every step), sends it SIGKILL after a random delay, then loads the path in
this process: the last complete copy must load (and verify), and a resumed training run
must log every step once, with the same losses as an uninterrupted run. Tiny random
models, so it runs on a CPU in minutes:

    python examples/kill_trials.py --trials 20 --output results/reliability/kills-and-mutants/kill_trials.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "tests" / "helpers.py"  # tiny random models and a model-free encoder, shared with the tests


def _helpers():
    """``tests/helpers.py`` (tests/ is not an installed package), imported by its file path."""
    spec = importlib.util.spec_from_file_location("kill_trials_helpers", HELPERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SAVE_CHILD = """
import sys, itertools, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from dynvocab import DynamicVocabLM
lm = AutoModelForCausalLM.from_pretrained(sys.argv[1]); tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = DynamicVocabLM.from_causal_lm(lm, tok)
sets = [["New York City", "the United States"], ["big red dog", "New York City", "small blue cat"]]
print("ready", flush=True)
for i in itertools.count():
    model.set_phrases(sets[i % 2])
    model.save_pretrained(sys.argv[2], save_phrases=True)
"""

INDEX_CHILD = """
import importlib.util, itertools, sys
spec = importlib.util.spec_from_file_location("kill_trials_helpers", sys.argv[3])
helpers = importlib.util.module_from_spec(spec); spec.loader.exec_module(helpers); HashEncoder = helpers.HashEncoder
from retrieval import DocumentIndex
docs = [{"id": f"d{i}", "text": f"the cat sat on mat {i}"} for i in range(2000)]
indexes = [DocumentIndex.build(docs[:1000], HashEncoder()), DocumentIndex.build(docs, HashEncoder())]
print("ready", flush=True)
for i in itertools.count():
    indexes[i % 2].save(sys.argv[2])
"""

TRAIN_CHILD = """
import sys, json
from dynvocab.training.config import TrainConfig
from dynvocab.training.trainer import Trainer
Trainer(TrainConfig(**json.loads(sys.argv[1]))).train()
"""


def tiny_lm(folder: Path) -> Path:
    from transformers import GPT2TokenizerFast

    from dynvocab.data.assets import gpt2_tokenizer_dir

    tiny_llama = _helpers().tiny_llama
    tokenizer = GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir())
    tiny_llama(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_and_kill(
    code: str, args: list[str], delay: tuple[float, float], rng: random.Random, wait_ready: bool,
    started: Path | None = None,
) -> float:
    """Start ``code`` in a subprocess, SIGKILL it after a random delay, counted from "ready" when it prints one,
    or from the moment the file ``started`` exists and is not empty."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             env=env, text=True)
    if wait_ready:
        child.stdout.readline()
    while started is not None and child.poll() is None and not (started.exists() and started.stat().st_size):
        time.sleep(0.05)
    seconds = rng.uniform(*delay)
    time.sleep(seconds)
    child.send_signal(signal.SIGKILL)
    child.wait()
    return seconds


def save_trials(trials: int, lm_dir: Path, work: Path, rng: random.Random) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dynvocab import DynamicVocabLM

    lm, tokenizer = AutoModelForCausalLM.from_pretrained(lm_dir), AutoTokenizer.from_pretrained(lm_dir)
    outcomes = []
    for trial in range(trials):
        path = work / f"model-{trial}"
        run_and_kill(SAVE_CHILD, [str(lm_dir), str(path)], (0.05, 1.5), rng, wait_ready=True)
        try:
            model = DynamicVocabLM.from_pretrained(path, lm, tokenizer)
            texts = {p.text.strip() for p in model.phrases}
            ok = texts in ({"New York City", "the United States"}, {"big red dog", "New York City", "small blue cat"})
            outcomes.append("loaded" if ok else f"wrong phrases {sorted(texts)}")
        except FileNotFoundError:
            outcomes.append("no save finished yet" if not path.exists() else "failed: files missing")
        except Exception as error:  # noqa: BLE001 - every other outcome is a failure to report
            outcomes.append(f"failed: {type(error).__name__}: {error}")
    return _count(outcomes)


def index_trials(trials: int, work: Path, rng: random.Random) -> dict:
    from retrieval import DocumentIndex

    HashEncoder = _helpers().HashEncoder
    outcomes = []
    for trial in range(trials):
        path = work / f"index-{trial}"
        run_and_kill(INDEX_CHILD, ["-", str(path), str(HELPERS)], (0.05, 1.0), rng, wait_ready=True)
        try:
            index = DocumentIndex.load(path, HashEncoder())
            outcomes.append("loaded" if len(index) in (1000, 2000) else f"wrong size {len(index)}")
        except ValueError as error:
            outcomes.append("no save finished yet" if not path.exists() else f"failed: {error}")
    return _count(outcomes)


def training_trials(trials: int, lm_dir: Path, data: Path, work: Path, rng: random.Random) -> dict:
    from dynvocab.training.config import TrainConfig
    from dynvocab.training.trainer import Trainer

    settings = dict(model=str(lm_dir), data=str(data), max_steps=8, batch_size=2, max_length=32, warmup_steps=1,
                    learning_rate=1e-2, log_every=1, save_every=1, mode="lora", support_texts=10)
    Trainer(TrainConfig(**settings, output_dir=str(work / "reference"))).train()
    reference = _log(work / "reference")
    outcomes = []
    for trial in range(trials):
        run = dict(settings, output_dir=str(work / f"train-{trial}"))
        # from the first logged step on: the 8 steps and their 8 checkpoints take about 4-20 s here
        run_and_kill(TRAIN_CHILD, [json.dumps(run)], (0.0, 12.0), rng, wait_ready=False,
                     started=Path(run["output_dir"]) / "log.jsonl")
        try:
            Trainer(TrainConfig(**run)).train(resume=True)
            outcome = "resumed"
        except FileNotFoundError as error:  # killed before the first checkpoint: the user starts afresh
            if "no complete checkpoint" not in str(error):
                raise
            Trainer(TrainConfig(**run)).train()
            outcome = "restarted (no checkpoint yet)"
        log = _log(Path(run["output_dir"]))
        steps_once = [r["step"] for r in log] == list(range(1, 9))
        same = steps_once and all(abs(a["loss"] - b["loss"]) <= 1e-5 * max(1.0, abs(b["loss"])) for a, b in zip(log, reference))
        outcomes.append(outcome if same else f"{outcome} but log differs: steps {[r['step'] for r in log]}")
    return _count(outcomes)


def _log(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "log.jsonl").read_text().splitlines()]


def _count(outcomes: list[str]) -> dict:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="write the counts here as JSON (merged into what is there)")
    parser.add_argument("--only", default="save_pretrained,index_save,training", help="comma-separated kinds to run")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lm_dir = tiny_lm(work / "lm")
        from dynvocab.data.assets import wikipedia_leads

        data = work / "data.txt"
        data.write_text("\n\n".join(lead["text"] for lead in wikipedia_leads()[:40]))
        results = {"trials_each": args.trials}
        kinds = args.only.split(",")
        for name, run in [("save_pretrained", lambda: save_trials(args.trials, lm_dir, work, rng)),
                          ("index_save", lambda: index_trials(args.trials, work, rng)),
                          ("training", lambda: training_trials(args.trials, lm_dir, data, work, rng))]:
            if name not in kinds:
                continue
            started = time.perf_counter()
            results[name] = run()
            print(f"{name}: {results[name]} ({time.perf_counter() - started:.0f} s)", flush=True)
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        previous = json.loads(output.read_text()) if output.exists() else {}
        output.write_text(json.dumps(previous | results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
