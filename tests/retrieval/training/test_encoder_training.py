"""Pre-training and fine-tuning loops on a tiny random BERT: losses logged, exports load, resume is exact."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from encoders.hybrid import HybridEncoder, hybrid_scores
from dynvocab.training.loop import LoopSettings
from retrieval.training.finetuning import ContrastiveModule, FinetuneConfig
from retrieval.training.pairs import held_out_queries, split_sentences, training_pairs
from retrieval.training.trainer import EncoderTrainer
from tests.tiny_mlm import save_tiny_mlm

TEXTS = ["the cat sat on the mat .", "paris is a city on the river .", "the dog ran in the water .",
         "money in the bank !", "the eiffel tower is in paris ."]


def _trainer(folder, output, steps, before_step=None):
    from encoders.dupmae import DupMAEForPretraining

    torch.manual_seed(0)
    model = DupMAEForPretraining.from_pretrained(str(folder))
    tokenizer = model.tokenizer

    def batch_at(step, process, processes):
        batch = tokenizer([TEXTS[step % 5], TEXTS[(step + 1) % 5]], padding=True, return_tensors="pt")
        return {**{k: batch[k] for k in ("input_ids", "attention_mask")}, "generator": torch.Generator().manual_seed(step)}

    settings = LoopSettings(max_steps=steps, save_every=2, log_every=1, warmup_steps=1, learning_rate=1e-3)
    return EncoderTrainer(model, settings, output, batch_at, lambda m, d: m.save_pretrained(d), before_step)


def test_pretraining_resume_is_exact(tmp_path):
    folder = save_tiny_mlm(tmp_path / "tiny")
    full = _trainer(folder, tmp_path / "full", 4).train()

    def killed(step):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _trainer(folder, tmp_path / "cut", 4, before_step=killed).train()
    resumed = _trainer(folder, tmp_path / "cut", 4).train(resume=True)
    assert resumed == pytest.approx(full, rel=1e-5)
    log = [json.loads(line) for line in (tmp_path / "full" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == [1, 2, 3, 4] and {"mlm", "decoder", "bow"} <= set(log[0])
    assert HybridEncoder.from_pretrained(str(tmp_path / "full" / "final"), dense_dim=8).encode(TEXTS).dense.shape == (5, 8)


def test_contrastive_module_scores_hybrid_pairs(tmp_path):
    encoder = HybridEncoder.from_pretrained(str(save_tiny_mlm(tmp_path / "tiny")), dense_dim=8).train()
    module = ContrastiveModule(encoder, "hybrid", temperature=1.0)
    q = encoder.tokenizer(["cat mat", "paris city"], padding=True, return_tensors="pt")
    d = encoder.tokenizer(TEXTS[:2] + TEXTS[2:4], padding=True, return_tensors="pt")
    terms = module(q["input_ids"], q["attention_mask"], d["input_ids"], d["attention_mask"], torch.tensor([0, 1, 2, 3]),
                   teacher=torch.tensor([[2.0, 0.0], [1.0, 0.5]]))
    assert set(terms) == {"loss", "contrastive", "distill"} and terms["loss"].requires_grad
    assert terms["loss"].item() == pytest.approx((terms["contrastive"] + terms["distill"]).item())


def test_hybrid_scores_are_sums_of_two_cosines(tmp_path):
    """Unit dense and top-k sparse parts: scores stay in [-1, 2] (raw dot products sent the loss near 900)."""
    encoder = HybridEncoder.from_pretrained(str(save_tiny_mlm(tmp_path / "tiny")), dense_dim=8)
    encoder = HybridEncoder(encoder.model, encoder.tokenizer, replace(encoder.config, sparse_k=5), encoder.projection)
    batch = encoder.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        dense, sparse = encoder(batch["input_ids"], batch["attention_mask"])
    assert torch.allclose(dense.norm(dim=1), torch.ones(5), atol=1e-5)
    assert torch.allclose(sparse.norm(dim=1), torch.ones(5), atol=1e-5) and ((sparse > 0).sum(1) <= 5).all()
    vectors = encoder.encode(TEXTS)
    assert np.allclose(np.linalg.norm(vectors.values, axis=1), 1.0, atol=1e-5), "encode stores what training scored"
    scores = hybrid_scores(vectors, vectors)
    assert scores.max() <= 2 + 1e-5 and scores.min() >= -1 - 1e-5


def test_hybrid_contrastive_loss_falls_at_the_default_temperature(tmp_path):
    torch.manual_seed(0)
    encoder = HybridEncoder.from_pretrained(str(save_tiny_mlm(tmp_path / "tiny")), dense_dim=8).train()
    module = ContrastiveModule(encoder, "hybrid", temperature=FinetuneConfig().temperature)
    q = encoder.tokenizer(["cat mat", "paris city", "dog water", "bank money"], padding=True, return_tensors="pt")
    d = encoder.tokenizer(TEXTS[:4], padding=True, return_tensors="pt")
    args = (q["input_ids"], q["attention_mask"], d["input_ids"], d["attention_mask"], torch.arange(4))
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = module(*args)["loss"]
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[0] <= 3 / module.temperature + math.log(4) and losses[-1] < 0.5 * losses[0], losses


def test_pairs_come_from_the_corpus_and_held_out_sentences_are_cut():
    documents = [{"id": f"d{i}", "title": f"Title {i}", "text": "First sentence is here now. Second sentence is here too. "
                  f"Third one has number {i} in it."} for i in range(4)]
    pairs = training_pairs(documents, seed=0)
    assert len(pairs) == 8 and all(p[2] in {d["id"] for d in documents} for p in pairs)
    ict = [p for p in pairs if not p[0].startswith("Title")]
    assert all(p[0] not in p[1] for p in ict), "the query sentence is cut out of its positive"
    queries, indexed = held_out_queries(documents, seed=0)
    assert len(queries) == 4 and all(q["question"] not in d["text"] for q, d in zip(queries, indexed))
    assert split_sentences("A b c. D e f! G h?") == ["A b c.", "D e f!", "G h?"]


def test_a_mean_pooled_dense_half_starts_as_the_sentence_encoder_it_is_built_on(tmp_path):
    """dense_dim = hidden size and pooling='mean': before any training the dense half scores exactly as the starting
    encoder (mean pooling, normalised), so fine-tuning starts from it instead of from a new projection of [CLS]."""
    from encoders import DenseEncoder

    folder = str(save_tiny_mlm(tmp_path / "tiny"))
    hybrid = HybridEncoder.from_pretrained(folder, representation="cls", dense_dim=16, pooling="mean")
    dense = DenseEncoder(folder, pooling="mean", normalize=True)
    np.testing.assert_allclose(hybrid.encode(TEXTS).dense, dense.encode(TEXTS), atol=1e-5)
    cls = HybridEncoder.from_pretrained(folder, representation="cls", dense_dim=16)
    assert not np.allclose(cls.encode(TEXTS).dense, dense.encode(TEXTS), atol=1e-3)  # [CLS] is another vector
    hybrid.save_pretrained(tmp_path / "saved")  # the pooling is part of the saved encoder
    again = HybridEncoder.from_pretrained(str(tmp_path / "saved"), representation="cls")
    assert again.config.pooling == "mean" and again.config.label == "MEAN:16"
    np.testing.assert_allclose(again.encode(TEXTS).dense, dense.encode(TEXTS), atol=1e-5)


@pytest.mark.parametrize(("text", "title", "dropped"), [
    ("Angkor Wat is the largest religious monument.", "Angkor Wat", True),
    ("The planet mercury is the closest to the Sun.", "Mercury (planet)", True),  # disambiguation left out
    ("Mercurial traders met in the port.", "Mercury (planet)", False),  # a whole word, not a prefix
    ("An ox pulls the cart.", "Ox", False),  # too short to tell
    ("The Seine flows through the city.", "Paris", False),
])
def test_a_mined_negative_that_names_the_positive_is_dropped(text, title, dropped):
    from retrieval.training.finetuning import likely_false_negative

    assert likely_false_negative(text, title) is dropped


def test_the_score_row_kl_matches_a_hand_computation_and_ignores_masked_entries():
    from retrieval.training.finetuning import score_rows_kl

    low = torch.finfo(torch.float32).min
    student = torch.tensor([[0.0, 0.0, low]])
    teacher = torch.tensor([[math.log(3.0), 0.0, low]])  # softmax (3/4, 1/4) against (1/2, 1/2)
    valid = torch.tensor([[True, True, False]])
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert score_rows_kl(student, teacher, valid).item() == pytest.approx(expected, rel=1e-6)
    assert score_rows_kl(teacher, teacher, valid).item() == 0.0


def _anchored(kind, folder):
    import copy

    from transformers import AutoModel

    torch.manual_seed(0)
    encoder = HybridEncoder.from_pretrained(folder, dense_dim=16, pooling="mean") if kind == "hybrid" \
        else AutoModel.from_pretrained(folder)
    return ContrastiveModule(encoder, kind, temperature=0.05, anchor=copy.deepcopy(encoder), anchor_weight=1.0)


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_the_anchor_term_is_zero_for_the_starting_encoder_and_positive_once_it_moves(tmp_path, kind):
    """The anchor is a frozen copy of the starting encoder scoring the same batch: identical weights give identical
    score rows (KL 0); moved weights give a positive KL whose gradient reaches the trained encoder only."""
    from tests.tiny_mlm import tiny_mlm_tokenizer

    module = _anchored(kind, str(save_tiny_mlm(tmp_path / "tiny"))).eval()
    tokenizer = tiny_mlm_tokenizer()
    q = tokenizer(["cat mat", "paris city", "dog water"], padding=True, return_tensors="pt")
    d = tokenizer(TEXTS[:3] + TEXTS[4:], padding=True, return_tensors="pt")
    args = (q["input_ids"], q["attention_mask"], d["input_ids"], d["attention_mask"], torch.tensor([0, 1, 2, 3]))
    assert module(*args)["anchor"].item() == 0.0
    with torch.no_grad():
        for parameter in module.encoder.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    terms = module(*args)
    assert terms["anchor"].item() > 1e-4
    assert terms["loss"].item() == pytest.approx((terms["contrastive"] + terms["anchor"]).item(), rel=1e-6)
    terms["loss"].backward()
    assert all(p.grad is None for p in module.anchor.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.encoder.parameters())
    assert not module.train().anchor.training  # the reference keeps dropout off while the student trains


def test_finetuning_with_the_anchor_logs_its_term_and_exports_a_dense_encoder(tmp_path):
    from encoders import DenseEncoder
    from retrieval.training.finetuning import finetune

    data = tmp_path / "corpus.jsonl"
    sentences = ["The cat sat on the mat.", "The dog ran in the water.", "Paris is a city on the river.",
                 "Money is in the bank.", "The eiffel tower is in paris."]
    data.write_text("".join(json.dumps({"text": " ".join(sentences[i:] + sentences[:i])}) + "\n" for i in range(5)))
    config = FinetuneConfig(model=str(save_tiny_mlm(tmp_path / "tiny")), encoder="dense", data=str(data),
                            output_dir=str(tmp_path / "out"), batch_size=4, max_steps=2, save_every=2, log_every=1,
                            warmup_steps=1, hard_negatives_from=5, anchor_weight=1.0, max_length=32)
    finetune(config)
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == [1, 2] and all(row["anchor"] >= 0 for row in log) and log[1]["anchor"] > 0
    assert DenseEncoder(str(tmp_path / "out" / "final")).encode(sentences).shape == (5, 16)
