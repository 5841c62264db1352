"""The trainer as a two-process job (``accelerate launch``, gloo on CPU) against one process with the same global batch.

No negatives here: negatives drawn from a batch (in-batch, pre-batch, prefix, ...) come from each rank's
own batch, so with them a two-process run is a different run from one process with the whole batch.
"""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from dynvocab.cli import main
from dynvocab.data.assets import wikipedia_leads
from dynvocab.multiword import CONFIG_NAME, WEIGHTS_NAME
from dynvocab.training.config import TrainConfig
from dynvocab.training.multiword import MultiWordTrainConfig, train_multiword
from dynvocab.training.trainer import Trainer, sample_stream
from tests.helpers import launch

#: float32 sums taken in another order (measured: losses 2e-6 apart, weights 7e-8)
LOSS_TOLERANCE = 1e-4
WEIGHT_TOLERANCE = 1e-5
SETTINGS = dict(
    mode="frozen", max_steps=4, max_length=32, negatives="", save_every=2, log_every=1, learning_rate=1e-2,
    warmup_steps=1, support_texts=20,
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_lm_dir):
    root = tmp_path_factory.mktemp("distributed")
    (root / "lm").symlink_to(tiny_lm_dir)
    (root / "data.txt").write_text("\n\n".join(lead["text"] for lead in wikipedia_leads()[:40]))
    return root


def config(root: Path, name: str, batch_size: int) -> TrainConfig:
    return TrainConfig(model=str(root / "lm"), data=str(root / "data.txt"), output_dir=str(root / name),
                       batch_size=batch_size, **SETTINGS)


def launch_two_processes(root: Path, name: str, *extra: str, command: str = "train", settings=SETTINGS) -> None:
    """``accelerate launch`` of ``dynvocab train`` (or ``command``) on two CPU processes, each with half the global batch of 4."""
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]
    launch(root, command, "--model", str(root / "lm"), "--data", str(root / "data.txt"), "--output-dir", str(root / name),
           "--batch-size", "2", *flags, *extra)


def log(root: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (root / name / "log.jsonl").read_text().splitlines()]


def weights(root: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(root / name / "final" / "phrase_encoder.safetensors")


def test_two_processes_train_as_one_with_the_same_global_batch_and_resume_together(setup):
    Trainer(config(setup, "one", batch_size=4)).train()
    launch_two_processes(setup, "two")

    one, two = log(setup, "one"), log(setup, "two")
    assert [r["step"] for r in two] == [1, 2, 3, 4]  # one writer
    assert [r["lr"] for r in two] == [r["lr"] for r in one]  # the warm-up and decay run once, not once per process
    assert two[-1]["lr"] > 0
    for a, b in zip(one, two):
        for term in ("loss", "phrase", "token", "phrase_mass", "accuracy"):
            assert abs(a[term] - b[term]) < LOSS_TOLERANCE, (a, b)
    reference = weights(setup, "one")
    for key, value in weights(setup, "two").items():
        torch.testing.assert_close(value, reference[key], atol=WEIGHT_TOLERANCE, rtol=0)

    # each checkpoint once, by the main process; every rank's RNG and negatives state inside it
    assert sorted(p.name for p in (setup / "two").iterdir()) == [
        "checkpoint-2", "checkpoint-4", "final", "log.jsonl", "state-cache", "train_config.json"
    ]
    checkpoint = setup / "two" / "checkpoint-2"
    assert {"trainer_state.json", "dynvocab_manifest.json"} <= {p.name for p in checkpoint.iterdir()}
    assert {"rank-0.json", "rank-1.json", "trainable.safetensors", "optimizer.pt", "scheduler.json"} <= {
        p.name for p in (checkpoint / "state").iterdir()
    }
    assert not [p for p in checkpoint.rglob("*") if p.suffix in (".pkl", ".bin")]  # nothing pickled
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert (state["step"], state["num_processes"]) == (2, 2)

    # stopped after step 2: the resumed two-process run ends where the uninterrupted one did
    shutil.copytree(setup / "two", setup / "resumed", symlinks=True)
    shutil.rmtree(setup / "resumed" / "checkpoint-4")
    shutil.rmtree(setup / "resumed" / "final")
    (setup / "resumed" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in two[:2]))
    launch_two_processes(setup, "resumed", "--resume")
    assert [(r["step"], r["loss"]) for r in log(setup, "resumed")] == [(r["step"], r["loss"]) for r in two]
    uninterrupted = weights(setup, "two")
    for key, value in weights(setup, "resumed").items():
        torch.testing.assert_close(value, uninterrupted[key], atol=0, rtol=0)

    with pytest.raises(ValueError, match="2 process.* this run has 1.*--num_processes 2"):
        Trainer(config(setup, "resumed", batch_size=2)).train(resume=True)


def test_shards_are_disjoint_and_cover_the_global_batches(setup):
    settings = config(setup, "shards", batch_size=2)
    tokenizer = AutoTokenizer.from_pretrained(setup / "lm")
    whole = sample_stream(dataclasses.replace(settings, batch_size=4), tokenizer, [])
    shards = [sample_stream(settings, tokenizer, [], shard, 2) for shard in range(2)]
    for _ in range(5):
        expected = [sample.token_ids for sample in next(whole)]
        parts = [[sample.token_ids for sample in next(stream)] for stream in shards]
        assert parts[0] + parts[1] == expected
    with pytest.raises(ValueError, match="shard=2"):
        next(sample_stream(settings, tokenizer, [], 2, 2))


def test_the_mwt_baseline_trains_on_two_processes_as_on_one(setup):
    settings = dict(num_ngrams=20, min_count=2, max_steps=4, max_length=32, learning_rate=0.05, warmup_steps=1, log_every=1)
    one = MultiWordTrainConfig(model=str(setup / "lm"), data=str(setup / "data.txt"), output_dir=str(setup / "mwt-one"),
                               batch_size=4, **settings)
    _, one_log = train_multiword(one)
    launch_two_processes(setup, "mwt-two", command="train-mwt", settings=settings)
    saved = json.loads((setup / "mwt-two" / "final" / CONFIG_NAME).read_text())
    assert saved["ngrams"] == json.loads((setup / "mwt-one" / "final" / CONFIG_NAME).read_text())["ngrams"]
    for a, b in zip(one_log, saved["train_log"], strict=True):
        assert abs(a["loss"] - b["loss"]) < LOSS_TOLERANCE, (a, b)
    rows = load_file(setup / "mwt-two" / "final" / WEIGHTS_NAME)
    for name, value in load_file(setup / "mwt-one" / "final" / WEIGHTS_NAME).items():
        torch.testing.assert_close(rows[name], value, atol=WEIGHT_TOLERANCE, rtol=0)


def test_two_processes_write_the_state_cache_one_process_writes(setup):
    from transformers import AutoModelForCausalLM

    from dynvocab.training.state_cache import build_state_cache
    from dynvocab.training.corpus import training_texts

    launch_two_processes(setup, "cache-two", "--shard-chunks", "16", command="cache-states", settings={"max_length": 32})
    lm = AutoModelForCausalLM.from_pretrained(setup / "lm", dtype=torch.float32)
    texts = list(training_texts(config(setup, "cache-one", batch_size=2)))
    one = build_state_cache(lm, AutoTokenizer.from_pretrained(setup / "lm"), texts, setup / "cache-one", max_length=32,
                            batch_size=2, shard_chunks=16)
    shards = json.loads((one / "cache_config.json").read_text())["shards"]
    assert shards > 2 and json.loads((setup / "cache-two" / "cache_config.json").read_text())["complete"]
    for name in ("chunks.npy", "tokens.npy", "hidden.npy", "token_stats.npy", "texts.jsonl"):
        assert (setup / "cache-two" / name).read_bytes() == (one / name).read_bytes(), name
    writers = [(setup / "cache-two" / "done" / f"shard-{k}").read_text() for k in range(shards)]
    assert writers == [f"process {k % 2}\n" for k in range(shards)]  # the shards were split, not written twice


@pytest.mark.parametrize("trainer", ["train-mwt", "pretrain-encoder", "finetune-encoder", "nar-train"])
def test_every_trainer_runs_on_two_processes_and_resumes_on_them(setup, tiny_encoder_dir, trainer):
    """The MWT, document-encoder and NAR trainers on the one loop, as two-process jobs: stopped after step 2 (a run to
    2 steps), resumed to 4; the log holds each step once and the checkpoints record both processes. (The phrase-encoder
    trainer's two-process resume is the first test of this file.)"""
    from tests.tiny_mlm import save_tiny_mlm

    root, out = setup, setup / trainer
    loop = ["--save-every", "1", "--log-every", "1", "--warmup-steps", "1", "--mixed-precision", "no"]
    if trainer == "nar-train":
        titles = [lead["title"] for lead in wikipedia_leads()[:12]]
        (root / "titles.txt").write_text("\n".join(titles))
        (root / "pairs.jsonl").write_text("".join(json.dumps({"query": f"about {t}", "docid": t}) + "\n" for t in titles))
        assert main(["build-vocab", "--data", str(root / "titles.txt"), "--output", str(root / "vocab"), "--size", "300"]) in (0, None)
        command = ["nar-train", "--vocab", str(root / "vocab"), "--data", str(root / "pairs.jsonl"), "--encoder",
                   str(tiny_encoder_dir), "--batch-size", "2", "--cluster-steps", "0"]
    elif trainer == "train-mwt":
        command = [trainer, "--model", str(root / "lm"), "--data", str(root / "data.txt"), "--batch-size", "2",
                   "--max-length", "32", "--num-ngrams", "20", "--min-count", "2"]
    else:
        mlm = save_tiny_mlm(root / f"mlm-{trainer}")
        command = [trainer, "--model", str(mlm), "--data", str(root / "data.txt"), "--batch-size", "2", "--max-length", "16"]
    launch(root, *command, *loop, "--output-dir", str(out), "--max-steps", "2")
    launch(root, *command, *loop, "--output-dir", str(out), "--max-steps", "4", "--resume")
    assert [row["step"] for row in log(root, trainer)] == [1, 2, 3, 4]
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["num_processes"] == 2
    assert sorted(p.name for p in (out / "checkpoint-4" / "state").glob("rank-*.json")) == ["rank-0.json", "rank-1.json"]
    assert (out / "final").is_dir() and any((out / "final").iterdir())
