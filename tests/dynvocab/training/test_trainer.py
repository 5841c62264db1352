import pytest
import torch
from safetensors.torch import load_file

from dynvocab.data.assets import wikipedia_leads
from dynvocab.training.config import TrainConfig
from dynvocab.training.trainer import Trainer


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_lm_dir):
    root = tmp_path_factory.mktemp("train")
    (root / "lm").symlink_to(tiny_lm_dir)
    (root / "data.txt").write_text("\n\n".join(lead["text"] for lead in wikipedia_leads()[:60]))
    return root


def config(root, name, **overrides) -> TrainConfig:
    settings = dict(
        model=str(root / "lm"), data=str(root / "data.txt"), output_dir=str(root / name), max_steps=6,
        batch_size=2, max_length=32, warmup_steps=1, learning_rate=1e-2, log_every=1, save_every=100,
        negatives="in-batch,pre-batch,prefix,self-retrieval,corpus-retrieval", support_texts=20,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def losses(root, name):
    import json

    return [json.loads(line)["loss"] for line in (root / name / "log.jsonl").read_text().splitlines()]


def test_loss_falls(setup):
    Trainer(config(setup, "falls", mode="full", max_steps=24, data=str(setup / "data.txt"))).train()
    values = losses(setup, "falls")
    assert sum(values[-4:]) / 4 < sum(values[:4]) / 4 - 0.5


def test_resume_gives_the_same_parameters_as_an_uninterrupted_run(setup):
    Trainer(config(setup, "straight", mode="lora")).train()
    interrupted = Trainer(config(setup, "resumed", mode="lora"))
    interrupted.config.max_steps = 3  # stop early: checkpoint-3 is written as an interruption would leave it
    interrupted.train()
    Trainer(config(setup, "resumed", mode="lora")).train(resume=True)
    straight = load_file(setup / "straight" / "final" / "phrase_encoder.safetensors")
    resumed = load_file(setup / "resumed" / "final" / "phrase_encoder.safetensors")
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    adapter = "lm_adapter/adapter_model.safetensors"
    for name, tensor in load_file(setup / "straight" / "final" / adapter).items():
        torch.testing.assert_close(load_file(setup / "resumed" / "final" / adapter)[name], tensor, msg=name)


def test_lora_trains_the_encoder_and_adapters_but_not_the_base_weights(setup):
    trainer = Trainer(config(setup, "lora", mode="lora", max_steps=3, negatives="in-batch,generation"))
    model = trainer.model
    base_before = {k: v.clone() for k, v in model.lm.named_parameters() if "lora_" not in k}
    encoder_before = {k: v.clone() for k, v in model.phrase_encoder.named_parameters() if v.requires_grad}
    trainer.train()
    for name, param in model.lm.named_parameters():
        if "lora_" not in name:
            assert torch.equal(param, base_before[name]), name
    changed = [k for k, v in model.phrase_encoder.named_parameters() if k in encoder_before and not torch.equal(v, encoder_before[k])]
    assert changed


def test_the_lm_learns_at_its_own_rate(setup):
    trainer = Trainer(config(setup, "lm-rate", mode="lora", max_steps=2, negatives="in-batch", lm_learning_rate=0.0))
    model = trainer.model
    adapters_before = {k: v.clone() for k, v in model.lm.named_parameters() if v.requires_grad}
    encoder_before = {k: v.clone() for k, v in model.phrase_encoder.named_parameters() if v.requires_grad}
    trainer.train()
    assert adapters_before and all(torch.equal(v, adapters_before[k]) for k, v in model.lm.named_parameters() if v.requires_grad)
    assert any(not torch.equal(v, encoder_before[k]) for k, v in model.phrase_encoder.named_parameters() if k in encoder_before)
    with pytest.raises(ValueError, match="lm_learning_rate is set but mode='frozen'"):
        TrainConfig(mode="frozen", lm_learning_rate=1e-5)


def test_resume_without_a_checkpoint_says_so(setup):
    with pytest.raises(FileNotFoundError, match="drop --resume"):
        Trainer(config(setup, "empty", mode="frozen")).train(resume=True)


@pytest.mark.parametrize("field, value, message", [("mode", "half", "mode="), ("negatives", "prefix,psychic", "psychic"),
                                                   ("phrases", "sentences", "phrases=")])
def test_bad_settings_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{field: value})


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_an_export_loads_back_with_what_the_lm_learned(setup, mode):
    from dynvocab.loading import load_dynamic_lm

    trainer = Trainer(config(setup, f"export-{mode}", mode=mode, max_steps=2))
    trainer.train()
    trained = trainer.model.eval()
    loaded = load_dynamic_lm(str(setup / "lm"), setup / f"export-{mode}" / "final")
    bare = load_dynamic_lm(str(setup / "lm"), None)
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        expected, got, untouched = (m.lm(input_ids=ids.to(m.device)).logits.cpu() for m in (trained, loaded, bare))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(untouched, expected, atol=1e-3)  # the LM did learn: a load without it would fail above
    for (name, a), b in zip(trained.phrase_encoder.state_dict().items(), loaded.phrase_encoder.state_dict().values()):
        torch.testing.assert_close(b, a.cpu(), msg=name)  # the trainer ran on the GPU where there is one


def test_frozen_token_readback_trains_from_the_state_cache_and_resumes_exactly(setup):
    import json

    settings = dict(mode="frozen", readback="tokens", eval_every=2, validation_chunks=8, state_cache=str(setup / "cache"))
    Trainer(config(setup, "cached", **settings)).train()
    interrupted = Trainer(config(setup, "cached-resumed", **settings))
    interrupted.config.max_steps = 3
    interrupted.train()
    Trainer(config(setup, "cached-resumed", **settings)).train(resume=True)
    straight = load_file(setup / "cached" / "final" / "phrase_encoder.safetensors")
    resumed = load_file(setup / "cached-resumed" / "final" / "phrase_encoder.safetensors")
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    records = [json.loads(line) for line in (setup / "cached" / "log.jsonl").read_text().splitlines()]
    assert {"val_phrase", "val_accuracy", "val_phrase_mass"} <= set(records[1]) and "kl" not in records[0]
    saved = json.loads((setup / "cached" / "final" / "dynvocab_config.json").read_text())
    assert saved["trained_readback"] == saved["readback"] == "tokens"


def test_the_paper_objective_stays_for_vector_readback(setup):
    import json

    Trainer(config(setup, "vector", mode="frozen", readback="vector", max_steps=2)).train()
    record = json.loads((setup / "vector" / "log.jsonl").read_text().splitlines()[-1])
    assert "kl" in record
    assert json.loads((setup / "vector" / "final" / "dynvocab_config.json").read_text())["trained_readback"] == "vector"


def test_decoding_with_the_other_readback_warns(setup, caplog):
    from dynvocab.loading import load_dynamic_lm

    model = load_dynamic_lm(str(setup / "lm"), setup / "vector" / "final")
    model.set_phrases([" the city of"])
    with caplog.at_level("WARNING"):
        model.generate(torch.tensor([[5, 17]]), max_new_tokens=2, do_sample=False)
    assert not any("trained for readback" in r.message for r in caplog.records)
    model.dynvocab_config.readback = "tokens"
    with caplog.at_level("WARNING"):
        model.generate(torch.tensor([[5, 17]]), max_new_tokens=2, do_sample=False)
    assert any("trained for readback='vector'" in r.message for r in caplog.records)


def test_generation_negatives_are_refused_where_the_lm_never_runs():
    with pytest.raises(ValueError, match="'generation'.*cached"):
        TrainConfig(mode="frozen", readback="tokens", negatives="in-batch,generation")
