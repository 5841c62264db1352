"""The hybrid's fusion weight: what it does to scores, where it is stored, and how fine-tuning chooses it."""

import json
from dataclasses import replace

import numpy as np
import pytest

from encoders.hybrid import HybridEncoder, HybridEncoderConfig, hybrid_scores
from retrieval.training.fusion import FUSION_WEIGHTS, fusion_reciprocal_ranks, held_out_pairs, one_standard_error_choice
from retrieval.training.pretraining import step_indices
from tests.tiny_mlm import save_tiny_mlm

TEXTS = ["the cat sat on the mat .", "paris is a city on the river .", "the dog ran in the water .",
         "money in the bank !", "the eiffel tower is in paris ."]


def test_the_sparse_weight_scales_the_sparse_cosine_and_travels_with_the_encoder(tmp_path):
    encoder = HybridEncoder.from_pretrained(str(save_tiny_mlm(tmp_path / "tiny")), dense_dim=8)
    unit, weighted = encoder.encode(TEXTS), encoder.with_sparse_weight(0.3).encode(TEXTS)
    dense = unit.dense @ unit.dense.T
    sparse = hybrid_scores(unit, unit) - dense
    np.testing.assert_allclose(hybrid_scores(weighted, weighted), dense + 0.3 * sparse, atol=1e-5)
    np.testing.assert_array_equal(weighted.ids, unit.ids)
    assert encoder.config.label == "CLS:8/OT:384" and encoder.with_sparse_weight(0.3).config.label == "CLS:8/OT:384x0.3"
    encoder.with_sparse_weight(0.3).save_pretrained(tmp_path / "saved")
    again = HybridEncoder.from_pretrained(str(tmp_path / "saved"))
    assert again.config.sparse_weight == 0.3
    assert again.with_representation("ot").config.sparse_weight == 0.3, "another representation keeps the weight"
    np.testing.assert_allclose(again.encode(TEXTS).values, weighted.values, atol=1e-6)


@pytest.mark.parametrize("weight", [-0.5, float("inf"), float("nan"), True, "1"])
def test_a_bad_sparse_weight_is_refused_with_the_rule(weight):
    with pytest.raises(ValueError, match="sparse_weight=.* must be a finite number >= 0"):
        HybridEncoderConfig(sparse_weight=weight)


def test_reciprocal_ranks_rank_each_positive_against_every_other_document():
    dense = np.array([[0.9, 0.8, 0.1], [0.5, 0.6, 0.0]])
    sparse = np.array([[0.0, 0.5, 0.0], [0.4, 0.0, 0.0]])
    ranks = fusion_reciprocal_ranks(dense, sparse, np.array([0, 0]), weights=(0.0, 1.0))
    np.testing.assert_allclose(ranks[0.0], [1, 1 / 2])  # query 1: first; query 2: behind 0.6
    np.testing.assert_allclose(ranks[1.0], [1 / 2, 1])  # query 1: 1.3 beats it; query 2: 0.9 is first
    tied = fusion_reciprocal_ranks(np.array([[0.5, 0.5]]), np.zeros((1, 2)), np.array([0]), weights=(0.0,))
    assert tied[0.0].tolist() == [0.5], "a tie counts against the positive"
    assert fusion_reciprocal_ranks(np.array([[0.1, 0.9]]), np.zeros((1, 2)), np.array([0]), k=1)[0.1].tolist() == [0.0]


def test_the_smallest_weight_within_one_standard_error_of_the_best_is_chosen():
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 1, 400)
    flat = {0.0: base, 0.5: base + rng.normal(0, 0.05, 400) + 0.002, 1.0: base - 0.01}
    assert one_standard_error_choice(flat) == 0.0, "a difference the queries cannot resolve keeps the sparse part off"
    clear = {0.0: base, 0.5: base + 0.05, 1.0: base + 0.049 + rng.normal(0, 0.01, 400)}
    assert one_standard_error_choice(clear) == 0.5, "a clear gain switches it on, at the smallest weight that has it"


def test_held_out_pairs_are_the_ones_no_step_drew_and_never_titles():
    pairs = [(f"sentence {i}", f"text {i}", f"d{i}") for i in range(30)] + [("Title 1", "text 1", "d1")]
    kept = held_out_pairs(pairs, {"Title 1"}, steps=3, batch_size=4, seed=0, processes=2, count=100)
    drawn = {row for step in range(3) for p in range(2) for row in step_indices(step, 4, len(pairs), 0, p, 2)}
    assert len(drawn) == 24 and len(kept) == 31 - 24 - (pairs.index(("Title 1", "text 1", "d1")) not in drawn)
    assert not {pairs.index(pair) for pair in kept} & drawn and all(pair[0] != "Title 1" for pair in kept)
    assert held_out_pairs(pairs, {"Title 1"}, steps=3, batch_size=4, seed=0, processes=2, count=2) == kept[:2]


def test_hybrid_finetuning_chooses_the_fusion_weight_on_held_out_pairs_and_saves_it(tmp_path):
    from retrieval.training.finetuning import FUSION_FILE, FinetuneConfig, finetune

    words = ["cat", "dog", "paris", "bank", "river", "tower", "water", "city", "money", "mat"]
    data = tmp_path / "corpus.jsonl"
    data.write_text("".join(json.dumps({"text": f"The {w} sat on the mat. The {w} ran in the water. The {w} is in the "
                                                f"city."}) + "\n" for w in words))
    config = FinetuneConfig(model=str(save_tiny_mlm(tmp_path / "tiny")), encoder="hybrid", data=str(data), dense_dim=16,
                            output_dir=str(tmp_path / "out"), batch_size=4, max_steps=2, save_every=2, log_every=1,
                            warmup_steps=1, hard_negatives_from=5, max_length=32, fusion_queries=6)
    result = finetune(config)
    record = json.loads((tmp_path / "out" / "final" / FUSION_FILE).read_text())
    assert 0 < record["queries"] <= 6 and set(record["mrr@10"]) == {f"{w:g}" for w in FUSION_WEIGHTS}
    assert record["sparse_weight"] in FUSION_WEIGHTS and "one standard error" in record["rule"]
    final = HybridEncoder.from_pretrained(str(tmp_path / "out" / "final"))
    assert final.config.sparse_weight == record["sparse_weight"] == result["sparse_weight"]
    assert final.config.pooling == "mean", "fine-tuning keeps the starting encoder's pooling by default"

    unchanged = replace(config, output_dir=str(tmp_path / "plain"), fusion_queries=0)
    finetune(unchanged)
    assert HybridEncoder.from_pretrained(str(tmp_path / "plain" / "final")).config.sparse_weight == 1.0
    assert not (tmp_path / "plain" / "final" / FUSION_FILE).exists()


def test_a_hybrid_fine_tuning_that_would_leave_no_held_out_pairs_fails_before_training(tmp_path):
    from retrieval.training.finetuning import FinetuneConfig, finetune

    data = tmp_path / "corpus.jsonl"
    data.write_text("".join(json.dumps({"text": f"The {w} sat on the mat. The {w} ran in the water. The {w} is here."})
                            + "\n" for w in ["cat", "dog", "paris", "bank"]))
    config = FinetuneConfig(model=str(save_tiny_mlm(tmp_path / "tiny")), encoder="hybrid", data=str(data), dense_dim=16,
                            output_dir=str(tmp_path / "out"), batch_size=4, max_steps=3, save_every=3, warmup_steps=1,
                            max_length=32)
    with pytest.raises(ValueError, match="leaving none to choose the hybrid's fusion weight on; train fewer steps"):
        finetune(config)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("checkpoint-*"))
