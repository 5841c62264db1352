"""The LM fine-tuned on a domain with LoRA, on the one loop: the baseline of the domain table."""

import json
import shutil

import pytest
import torch

from dynvocab.loading import load_lm
from dynvocab.training.lm_finetune import LMFinetuneConfig, finetune_lm, held_out_texts


def config(tmp_path, name, **overrides) -> LMFinetuneConfig:
    settings = dict(model=str(tmp_path / "lm"), data="licenses", output_dir=str(tmp_path / name), max_steps=4,
                    batch_size=2, max_length=24, warmup_steps=1, learning_rate=1e-2, log_every=1, save_every=2,
                    eval_every=2, eval_texts=3, lora_r=4, lora_alpha=8, lora_dropout=0.0)
    return LMFinetuneConfig(**settings | overrides)


@pytest.fixture
def root(tmp_path, tiny_lm_dir):
    (tmp_path / "lm").symlink_to(tiny_lm_dir)
    return tmp_path


def test_the_adapter_loads_as_the_lm_and_the_log_is_the_learning_curve(root):
    log = finetune_lm(config(root, "run"))
    assert [r["step"] for r in log] == [0, 1, 2, 3, 4]  # step 0: the base LM's held-out loss, where the curve starts
    curve = [r for r in log if "heldout_loss" in r]
    assert [r["step"] for r in curve] == [0, 2, 4] and all(r["heldout_ppl"] > 1 for r in curve)
    final = root / "run" / "final"
    adapter = json.loads((final / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(root / "lm") and (final / "adapter_model.safetensors").is_file()
    assert [r["step"] for r in map(json.loads, (final / "log.jsonl").read_text().splitlines())] == [0, 1, 2, 3, 4]
    tuned, _ = load_lm(str(final))
    base, tokenizer = load_lm(str(root / "lm"))
    ids = torch.tensor([tokenizer.encode("Permission is hereby granted")])
    with torch.no_grad():
        assert not torch.allclose(tuned(ids).logits, base(ids).logits)  # the adapter is folded in, not dropped
        assert type(tuned) is type(base)  # a plain causal LM: every command that takes --model takes it


def test_a_resumed_fine_tune_is_the_uninterrupted_one(root):
    straight = finetune_lm(config(root, "straight"))
    finetune_lm(config(root, "cut"))
    for killed in ("checkpoint-4", "final"):  # what a kill after the save of step 2 leaves
        shutil.rmtree(root / "cut" / killed)
    resumed = finetune_lm(config(root, "cut"), resume=True)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    for ours, reference in zip(resumed, straight):
        assert ours.keys() == reference.keys()
        for key in {"loss", "heldout_loss"} & reference.keys():
            assert ours[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-6)


def test_held_out_texts_are_never_trained_on():
    from dynvocab.data.corpora import corpus_split

    indexed, held_out = corpus_split("licenses")
    texts = held_out_texts(LMFinetuneConfig(data="licenses"))
    assert texts == [d["text"] for d in held_out] and not set(texts) & {d["text"] for d in indexed}
    assert held_out_texts(LMFinetuneConfig(data="some/file.txt")) == []


@pytest.mark.parametrize(("overrides", "fragment"), [
    ({"max_length": 1}, "max_length=1 must be >= 2"),
    ({"lora_dropout": 1.0}, "lora_dropout=1.0 must be in [0, 1)"),
    ({"lora_r": 0}, "lora_r"),
    ({"eval_every": -1}, "eval_every"),
    ({"held_out": 1.0}, "held_out=1.0 must be a fraction in (0, 1)"),
])
def test_bad_settings_are_refused_naming_the_field(overrides, fragment):
    with pytest.raises(ValueError, match=None) as raised:
        LMFinetuneConfig(**overrides)
    assert fragment in str(raised.value)
