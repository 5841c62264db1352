"""Model soups of fine-tuned encoders: the weighted mean of their weights, written as an encoder folder."""

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from dynvocab.cli import main
from retrieval.training.soup import soup_encoders


@pytest.fixture
def runs(tmp_path, tiny_encoder_dir):
    """Two 'fine-tuned' copies of the tiny encoder: its weights plus 1 and plus 3."""
    folders = []
    for shift in (1.0, 3.0):
        model = AutoModel.from_pretrained(tiny_encoder_dir)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(shift)
        model.save_pretrained(tmp_path / f"run{shift:g}")
        if shift == 3.0:  # the tokenizer of the soup comes from the first folder that has one
            AutoTokenizer.from_pretrained(tiny_encoder_dir).save_pretrained(tmp_path / f"run{shift:g}")
        folders.append(tmp_path / f"run{shift:g}")
    return folders


def weights(folder) -> dict[str, torch.Tensor]:
    return dict(AutoModel.from_pretrained(folder).named_parameters())


def test_the_soup_is_the_mean_and_the_base_is_mixed_in_by_its_weight(runs, tmp_path, tiny_encoder_dir):
    base = weights(tiny_encoder_dir)
    soup = weights(soup_encoders(runs, tmp_path / "soup"))
    assert all(torch.allclose(soup[name], base[name] + 2.0, atol=1e-5) for name in base)
    mixed = weights(soup_encoders(runs, tmp_path / "mixed", base=tiny_encoder_dir, base_weight=0.5))
    assert all(torch.allclose(mixed[name], base[name] + 1.0, atol=1e-5) for name in base)


def test_bad_soups_are_refused(runs, tmp_path, tiny_lm_dir):
    with pytest.raises(ValueError, match="at least one encoder"):
        soup_encoders([], tmp_path / "none")
    with pytest.raises(ValueError, match="base must be given"):
        soup_encoders(runs, tmp_path / "nobase", base_weight=0.5)
    with pytest.raises(ValueError, match="hold a tokenizer"):
        soup_encoders(runs[:1], tmp_path / "untokenized")
    with pytest.raises(ValueError, match="does not have the architecture") as refused:
        soup_encoders([runs[0], tiny_lm_dir], tmp_path / "other")
    assert str(refused.value).startswith(str(tiny_lm_dir))  # the odd one out is named
    assert not (tmp_path / "other").exists()


def test_the_command_line_writes_the_soup(runs, tmp_path, capsys):
    main(["soup-encoders", "--encoders", ",".join(map(str, runs)), "--output", str(tmp_path / "cli-soup")])
    assert '"soup"' in capsys.readouterr().out and (tmp_path / "cli-soup" / "config.json").is_file()
    assert len(AutoTokenizer.from_pretrained(tmp_path / "cli-soup")) == len(AutoTokenizer.from_pretrained(runs[1]))


@pytest.fixture
def hybrid_runs(tmp_path):
    """Two 'fine-tuned' hybrids of the tiny masked LM: every weight (head and projection too) plus 1 and plus 3, fusion
    weights 0.2 and 0.4."""
    from encoders.hybrid import HybridEncoder
    from tests.tiny_mlm import save_tiny_mlm

    start = save_tiny_mlm(tmp_path / "start")
    folders = []
    for shift, weight in ((1.0, 0.2), (3.0, 0.4)):
        hybrid = HybridEncoder.from_pretrained(str(start), dense_dim=16, pooling="mean")
        with torch.no_grad():
            for parameter in hybrid.parameters():
                parameter.add_(shift)
        hybrid.with_sparse_weight(weight).save_pretrained(tmp_path / f"hybrid{shift:g}")
        folders.append(tmp_path / f"hybrid{shift:g}")
    return start, folders


def test_hybrids_soup_every_weight_and_mix_only_the_body_and_projection_with_the_base(hybrid_runs, tmp_path):
    from encoders.hybrid import HybridEncoder

    start, runs = hybrid_runs
    base = HybridEncoder.from_pretrained(str(start), dense_dim=16, pooling="mean")
    base_weights, eye = dict(base.model.named_parameters()), torch.eye(16)
    soup = HybridEncoder.from_pretrained(str(soup_encoders(runs, tmp_path / "soup")))
    assert soup.config.sparse_weight == pytest.approx(0.3) and soup.config.pooling == "mean"
    assert all(torch.allclose(p, base_weights[n] + 2.0, atol=1e-5) for n, p in soup.model.named_parameters())
    assert torch.allclose(soup.projection.weight, eye + 2.0, atol=1e-5)
    mixed = HybridEncoder.from_pretrained(str(soup_encoders(runs, tmp_path / "mixed", base=start, base_weight=0.5)))
    for name, parameter in mixed.model.named_parameters():
        shift = 2.0 if name.startswith("cls.predictions.transform") or name == "cls.predictions.bias" else 1.0
        assert torch.allclose(parameter, base_weights[name] + shift, atol=1e-5), name
    assert mixed.model.get_output_embeddings().weight is mixed.model.get_input_embeddings().weight
    assert torch.allclose(mixed.projection.weight, eye + 1.0, atol=1e-5), "the base's projection is the identity"


def test_a_soup_of_a_hybrid_and_a_dense_encoder_is_refused(hybrid_runs, runs, tmp_path):
    with pytest.raises(ValueError, match="is not a hybrid encoder folder"):
        soup_encoders([hybrid_runs[1][0], runs[0]], tmp_path / "mixed-kinds")
    assert not (tmp_path / "mixed-kinds").exists()


def test_a_hybrid_soup_refuses_a_base_when_its_projection_did_not_start_as_the_identity(tmp_path):
    from encoders.hybrid import HybridEncoder
    from tests.tiny_mlm import save_tiny_mlm

    start = save_tiny_mlm(tmp_path / "start")
    HybridEncoder.from_pretrained(str(start), dense_dim=8).save_pretrained(tmp_path / "narrow")
    with pytest.raises(ValueError, match="projects to 8 dims, not its hidden size 16"):
        soup_encoders([tmp_path / "narrow"], tmp_path / "soup", base=start, base_weight=0.5)
