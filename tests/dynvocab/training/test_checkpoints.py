"""Trainer checkpoints under faults: half-written or corrupted ones are skipped, the log never repeats a step,
old ones rotate out, and bad training data is refused instead of looping forever."""

import json
import shutil
import signal

import pytest

from dynvocab.data.assets import wikipedia_leads
from dynvocab.io.atomic import MANIFEST
from dynvocab.training.config import TrainConfig
from dynvocab.training.trainer import Trainer


@pytest.fixture(scope="module")
def root(tmp_path_factory, tiny_lm_dir):
    root = tmp_path_factory.mktemp("checkpoints")
    (root / "data.txt").write_text("\n\n".join(lead["text"] for lead in wikipedia_leads()[:40]))
    (root / "lm").symlink_to(tiny_lm_dir)
    return root


def config(root, name, **overrides) -> TrainConfig:
    settings = dict(
        model=str(root / "lm"), data=str(root / "data.txt"), output_dir=str(root / name), max_steps=6, batch_size=2,
        max_length=32, warmup_steps=1, learning_rate=1e-2, log_every=1, save_every=2, mode="frozen", support_texts=10,
    )
    return TrainConfig(**settings | overrides)


def log(root, name):
    return [json.loads(line) for line in (root / name / "log.jsonl").read_text().splitlines()]


def checkpoints(root, name):
    return sorted(p.name for p in (root / name).iterdir() if p.name.startswith("checkpoint-"))


@pytest.fixture(scope="module")
def straight(root):
    Trainer(config(root, "straight")).train()
    return log(root, "straight")


def test_old_checkpoints_rotate_out(root, straight):
    assert checkpoints(root, "straight") == ["checkpoint-4", "checkpoint-6"]  # save_total_limit=2


@pytest.mark.parametrize("damage", ["manifest-missing", "state-corrupted", "export-only"])
def test_resume_skips_a_half_written_newest_checkpoint_and_never_logs_a_step_twice(root, straight, damage):
    name = f"killed-{damage}"
    Trainer(config(root, name)).train()
    newest = root / name / "checkpoint-6"
    if damage == "manifest-missing":  # what a kill while checkpoint-6 is being written leaves: its staging folder
        (newest / MANIFEST).unlink()
        newest.rename(root / name / ".checkpoint-6.dynvocab-staging-killed")
    elif damage == "export-only":  # killed after the export was written, before the resume state: no state/ (where
        shutil.rmtree(newest / "state")  # the negatives' state is) and no trainer_state.json; once refused as "an
        (newest / "trainer_state.json").unlink()  # older trainer's", now the complete checkpoint-4 resumes
    else:
        (newest / "state" / "optimizer.pt").write_bytes(b"\0" * 64)
    (root / name / "final").rename(root / name / "final-old")
    Trainer(config(root, name)).train(resume=True)
    resumed = log(root, name)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    for ours, reference in zip(resumed, straight):
        assert ours["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-6)


def test_resume_with_no_complete_checkpoint_says_so(root):
    Trainer(config(root, "none-complete", max_steps=2, save_every=100)).train()
    (root / "none-complete" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        Trainer(config(root, "none-complete", max_steps=2)).train(resume=True)


def test_resume_with_another_mode_names_the_mismatch(root, straight):
    trainer = Trainer(config(root, "straight", mode="lora"))
    with pytest.raises(ValueError, match="another --mode or model"):
        trainer.train(resume=True)


@pytest.mark.parametrize("text", ["", "one two"], ids=["empty-file", "too-short-for-a-phrase"])
def test_training_data_without_a_sample_is_refused_not_looped_on(root, text):
    (root / "tiny.txt").write_text(text)

    def hang(*_):
        raise TimeoutError("training on data without samples did not stop")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    try:
        with pytest.raises(ValueError, match="yields no training sample"):
            Trainer(config(root, "no-samples", data=str(root / "tiny.txt"), support_texts=1)).train()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    ("field", "value", "error", "fragment"),
    [
        ("save_total_limit", -1, ValueError, "keeps every checkpoint"),
        ("max_steps", 0, ValueError, ">= 1"),
        ("batch_size", "8", TypeError, "must be int"),
        ("learning_rate", "3e-4", TypeError, "must be float"),
        ("held_out", 1.5, ValueError, "fraction"),
        ("mixed_precision", "fp8", ValueError, "mixed_precision"),
        ("phrases", "sentences", ValueError, "phrases="),
        ("negatives", "prefix,psychic", ValueError, "psychic"),
        ("mode", "half", ValueError, "mode="),
        ("readback", "bytes", ValueError, "readback='bytes'"),
        ("negatives", "in-batch,generation", ValueError, "drop 'generation'"),
        ("eval_every", -1, ValueError, "eval_every=-1 must be >= 0"),
        ("validation_chunks", 0, ValueError, "validation_chunks=0 must be >= 1"),
        ("spelling_negatives", "yes", TypeError, "must be bool"),
    ],
)
def test_bad_training_settings_are_named(field, value, error, fragment):
    with pytest.raises(error) as raised:
        TrainConfig(**{field: value})
    assert fragment in str(raised.value)


def test_an_output_dir_or_cache_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("x")
    for field in ("output_dir", "state_cache"):
        with pytest.raises(ValueError, match=f"{field}=.*is an existing file"):
            TrainConfig(**{field: str(tmp_path / "a-file")})
    with pytest.raises(ValueError, match="needs readback='tokens' with mode='frozen'"):
        TrainConfig(readback="vector", eval_every=10)
