"""A fine-tuned encoder as a LoRA adapter on its start: the truncated SVD of each weight's difference."""

import copy

import pytest
import torch

from encoders.low_rank import adapter_base, is_adapter, load_merged, low_rank_adapter


def tuned_copy(model, seed: int = 1):
    """``model`` with every weight moved (layer norms and biases too), as fine-tuning would."""
    torch.manual_seed(seed)
    tuned = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in tuned.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return tuned


def test_at_full_rank_the_merged_adapter_is_the_tuned_encoder(tiny_bert, tmp_path):
    before = {k: v.clone() for k, v in tiny_bert.state_dict().items()}
    tuned = tuned_copy(tiny_bert)
    adapter, errors = low_rank_adapter(tiny_bert, tuned, rank=16, dtype=torch.float32)
    assert max(errors.values()) < 1e-5
    assert all(torch.equal(before[k], v) for k, v in tiny_bert.state_dict().items()), "the base is left as it was"
    adapter.save_pretrained(tmp_path)
    assert is_adapter(tmp_path) and not is_adapter(tmp_path / "missing")
    merged = load_merged(copy.deepcopy(tiny_bert), tmp_path).state_dict()
    for name, value in tuned.state_dict().items():
        assert torch.allclose(merged[name], value, atol=1e-5), name
    inputs = {"input_ids": torch.tensor([[2, 5, 9, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    merged_model = load_merged(copy.deepcopy(tiny_bert), tmp_path)
    assert torch.allclose(merged_model(**inputs).last_hidden_state, tuned(**inputs).last_hidden_state, atol=1e-5)


def test_a_rank_one_change_is_kept_exactly_and_a_cut_reports_the_svd_tail(tiny_bert):
    tuned = copy.deepcopy(tiny_bert)
    query = "encoder.layer.0.attention.self.query"
    weight = tuned.get_submodule(query).weight
    u, v = torch.randn(weight.shape[0], 1), torch.randn(1, weight.shape[1])
    with torch.no_grad():
        weight.add_(0.1 * u @ v)
    _, errors = low_rank_adapter(tiny_bert, tuned, rank=1, dtype=torch.float32)
    assert list(errors) == [query] and errors[query] < 1e-6, "only the changed matrix is adapted, exactly"
    moved = tuned_copy(tiny_bert)
    difference = (moved.get_submodule(query).weight - tiny_bert.get_submodule(query).weight).detach().double()
    singular = torch.linalg.svdvals(difference)
    _, errors = low_rank_adapter(tiny_bert, moved, rank=2, dtype=torch.float32)
    expected = singular[2:].norm() / moved.get_submodule(query).weight.detach().double().norm()
    assert errors[query] == pytest.approx(float(expected), rel=1e-4)


def test_bad_adapters_are_refused(tiny_bert, tiny_lm_dir):
    from transformers import AutoModel

    with pytest.raises(ValueError, match="rank=0 must be a positive int"):
        low_rank_adapter(tiny_bert, tuned_copy(tiny_bert), rank=0)
    with pytest.raises(ValueError, match="no difference to keep"):
        low_rank_adapter(tiny_bert, copy.deepcopy(tiny_bert), rank=4)
    with pytest.raises(ValueError, match="pass the encoder it was fine-tuned from"):
        low_rank_adapter(tiny_bert, AutoModel.from_pretrained(tiny_lm_dir), rank=4)


def test_the_adapter_names_its_base(tiny_bert, tmp_path):
    adapter, _ = low_rank_adapter(tiny_bert, tuned_copy(tiny_bert), rank=4)
    adapter.peft_config["default"].base_model_name_or_path = "org/base-encoder"
    adapter.save_pretrained(tmp_path, save_embedding_layers=False)
    assert adapter_base(tmp_path) == "org/base-encoder"
