"""DupMAE pre-training on a tiny random BERT: masks checked by hand, the BoW loss against a hand computation."""

import math

import pytest
import torch

from encoders.dupmae import DupMAEConfig, DupMAEForPretraining, bag_of_words_loss
from encoders.masking import IGNORE_INDEX, bag_of_words_targets, decoder_attention_mask, mask_for_mlm, ordinary_tokens
from tests.tiny_mlm import save_tiny_mlm


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_mlm(tmp_path_factory.mktemp("tiny-mlm"))


def test_decoder_mask_hand_checked_case():
    # 6 real tokens then 2 pads; ratio 0.5 -> each row 1..5 sees round(0.5 * (6 - 2)) = 2 others plus position 0
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    visible = decoder_attention_mask(attention, 0.5, torch.Generator().manual_seed(0))[0]
    assert visible[:, 0].all(), "every row sees the [CLS] position"
    for row in range(1, 6):
        assert not visible[row, row], f"row {row} sees itself"
        assert not visible[row, 6:].any(), "padding is never visible"
        assert int(visible[row, 1:].sum()) == 2, f"row {row} sees {visible[row].tolist()}"
    assert visible[0].tolist() == [True] + [False] * 7, "row 0 sees only position 0"
    assert visible[6].tolist() == [True] + [False] * 7, "a padded row sees only position 0"


def test_decoder_mask_varies_by_row_and_seed():
    attention = torch.ones(1, 20, dtype=torch.long)
    a = decoder_attention_mask(attention, 0.5, torch.Generator().manual_seed(0))
    b = decoder_attention_mask(attention, 0.5, torch.Generator().manual_seed(1))
    assert not torch.equal(a, b)
    assert len({tuple(row.tolist()) for row in a[0, 1:]}) > 1
    assert torch.equal(a, decoder_attention_mask(attention, 0.5, torch.Generator().manual_seed(0)))


def test_mlm_masking_touches_only_ordinary_tokens():
    ids = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 3, 0]])
    attention = (ids != 0).long()
    ordinary = ordinary_tokens(ids, attention, [0, 2, 3])
    masked, labels = mask_for_mlm(ids, ordinary, 0.99, 4, 30, torch.Generator().manual_seed(0))
    assert (labels[~ordinary] == IGNORE_INDEX).all()
    assert torch.equal(masked[~ordinary], ids[~ordinary])
    assert torch.equal(labels[labels != IGNORE_INDEX], ids[labels != IGNORE_INDEX])


def test_bag_of_words_loss_matches_hand_computation():
    # vocabulary of 4; two positions pooled, one excluded; targets: unique tokens {1, 2} (token 1 twice)
    logits = torch.tensor([[[1.0, 2.0, 0.0, 0.5], [0.0, 1.0, 3.0, 0.0], [9.0, 9.0, 9.0, 9.0]]])
    pool = torch.tensor([[True, True, False]])
    ids = torch.tensor([[1, 2, 1]])
    targets = bag_of_words_targets(ids, torch.ones_like(ids, dtype=torch.bool), 4)
    assert targets.tolist() == [[0.0, 0.5, 0.5, 0.0]]
    pooled = [1.0, 2.0, 3.0, 0.5]
    log_z = math.log(sum(math.exp(x) for x in pooled))
    expected = -0.5 * ((2.0 - log_z) + (3.0 - log_z))
    assert bag_of_words_loss(logits, pool, targets).item() == pytest.approx(expected, rel=1e-6)


def test_forward_gives_three_weighted_terms(tiny_dir):
    model = DupMAEForPretraining.from_pretrained(str(tiny_dir), DupMAEConfig(mlm_weight=1.0, decoder_weight=2.0, bow_weight=0.5))
    batch = model.tokenizer(["the cat sat on the mat", "paris is a city of the river"], padding=True, return_tensors="pt")
    terms = model(batch["input_ids"], batch["attention_mask"], torch.Generator().manual_seed(0))
    assert set(terms) == {"loss", "mlm", "decoder", "bow"}
    expected = terms["mlm"] + 2.0 * terms["decoder"] + 0.5 * terms["bow"]
    assert terms["loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    terms["loss"].backward()
    assert model.decoder.attention.in_proj_weight.grad is not None


def test_save_and_reload_keeps_decoder(tiny_dir, tmp_path):
    model = DupMAEForPretraining.from_pretrained(str(tiny_dir), DupMAEConfig(bow_weight=0.1))
    model.save_pretrained(tmp_path)
    again = DupMAEForPretraining.from_pretrained(str(tmp_path))
    assert again.config.bow_weight == 0.1
    for name, tensor in model.decoder.state_dict().items():
        assert torch.equal(tensor, again.decoder.state_dict()[name]), name
