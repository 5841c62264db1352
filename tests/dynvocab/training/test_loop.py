"""The one training loop, on a model small enough to run in milliseconds: exact resume, a damaged checkpoint skipped,
the log cut back, rotation, clipping and the schedule from the settings, checkpoints of older releases refused."""

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dynvocab.training.loop import LoopSettings, TrainingLoop

SETTINGS = LoopSettings(max_steps=6, learning_rate=0.1, warmup_steps=2, weight_decay=0.0, log_every=1, save_every=2,
                        save_total_limit=0, mixed_precision="no")


class Regression(TrainingLoop):
    """Least squares on random batches drawn from the torch RNG (so an exact resume needs the RNG state back),
    with a counter in its extra state; ``stop_at`` interrupts the run as a kill would."""

    def __init__(self, output_dir: Path, settings: LoopSettings = SETTINGS, stop_at: int | None = None) -> None:
        torch.manual_seed(0)
        super().__init__(torch.nn.Linear(4, 1), settings, output_dir)
        self.batches, self.stop_at = 0, stop_at

    def training_terms(self) -> dict[str, torch.Tensor]:
        if self.step == self.stop_at:
            raise KeyboardInterrupt
        x = torch.randn(8, 4)
        loss = ((self.module(x).squeeze(-1) - x.sum(-1)) ** 2).mean()
        self.batches += 1
        return {"loss": loss}

    def write_export(self, directory: Path) -> None:
        torch.save(self.unwrapped.state_dict(), directory / "weights.pt")

    def extra_state(self) -> dict:
        return {"batches": self.batches}

    def load_extra_state(self, state: dict) -> None:
        self.batches = state["batches"]


def log_lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


def interrupted_then_resumed(folder: Path, stop_at: int) -> Regression:
    with pytest.raises(KeyboardInterrupt):
        Regression(folder, stop_at=stop_at).train()
    resumed = Regression(folder)
    resumed.train(resume=True)
    return resumed


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, Regression]:
    folder = tmp_path_factory.mktemp("straight")
    trainer = Regression(folder)
    trainer.train()
    return folder, trainer


def test_a_resumed_run_is_the_uninterrupted_one(tmp_path, straight):
    folder, whole = straight
    resumed = interrupted_then_resumed(tmp_path, stop_at=5)  # step 5 was logged after checkpoint-4: cut back
    for a, b in zip(whole.unwrapped.parameters(), resumed.unwrapped.parameters()):
        assert torch.equal(a, b)
    assert resumed.batches == whole.batches == 6
    assert log_lines(tmp_path) == [dict(r, seconds=s["seconds"]) for r, s in zip(log_lines(folder), log_lines(tmp_path))]
    assert [r["step"] for r in log_lines(tmp_path)] == [1, 2, 3, 4, 5, 6]  # no step logged twice
    assert (tmp_path / "final" / "weights.pt").is_file() and (tmp_path / "log.jsonl").is_file()


def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(tmp_path, straight, caplog):
    with pytest.raises(KeyboardInterrupt):
        Regression(tmp_path, stop_at=5).train()
    (tmp_path / "checkpoint-4" / "state" / "optimizer.pt").write_bytes(b"torn")
    with caplog.at_level(logging.WARNING):
        resumed = Regression(tmp_path)
        resumed.train(resume=True)
    assert "skipping" in caplog.text and "checkpoint-4" in caplog.text
    for a, b in zip(straight[1].unwrapped.parameters(), resumed.unwrapped.parameters()):
        assert torch.equal(a, b)
    assert [r["step"] for r in log_lines(tmp_path)] == [1, 2, 3, 4, 5, 6]


def test_rotation_keeps_the_newest_checkpoints(tmp_path):
    Regression(tmp_path, replace(SETTINGS, save_every=1, save_total_limit=2)).train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-5", "checkpoint-6"]


def test_clipping_and_the_schedule_come_from_the_settings(tmp_path, monkeypatch):
    trainer = Regression(tmp_path, replace(SETTINGS, max_grad_norm=0.25))
    norms = []
    clip = trainer.accelerator.clip_grad_norm_
    monkeypatch.setattr(trainer.accelerator, "clip_grad_norm_", lambda params, norm: norms.append(norm) or clip(params, norm))
    trainer.train()
    assert norms == [0.25] * 6
    # linear warm-up over 2 steps, then linear decay to 0 at step 6, one scheduler step per optimizer step
    assert [round(r["lr"], 6) for r in log_lines(tmp_path)] == [0.0, 0.05, 0.1, 0.075, 0.05, 0.025]


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    trainer = Regression(tmp_path, replace(SETTINGS, grad_accum=3, max_steps=2, save_every=5))
    trainer.train()
    assert trainer.batches == 6 and trainer.step == 2


@pytest.mark.parametrize("old_files", [
    {"module.safetensors": "safetensors", "trainer_state.json": "{}"},  # the old document-encoder trainer
    {"model.safetensors": "safetensors", "optimizer.safetensors": "safetensors", "manifest.json": "{}"},  # old NAR
])
def test_a_checkpoint_of_an_older_release_is_refused_with_what_to_do(tmp_path, old_files):
    old = tmp_path / "checkpoint-10"
    old.mkdir()
    for name, kind in old_files.items():
        if kind == "safetensors":
            save_file({"w": torch.zeros(1)}, old / name)
        else:
            (old / name).write_text(kind)
    with pytest.raises(ValueError, match="older dynvocab trainer.*new --output-dir"):
        Regression(tmp_path).train(resume=True)
    assert (old / "module.safetensors").exists() or (old / "model.safetensors").exists()  # nothing deleted


def test_resume_without_a_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="drop --resume"):
        Regression(tmp_path).train(resume=True)
