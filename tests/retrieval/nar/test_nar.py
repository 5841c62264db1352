"""The NAR retriever: its loss against hand-computed values, training with exact resume, search with and without a shortlist."""

import json
import shutil

import pytest
import torch

from dynvocab.scoring.shortlist_head import ShortlistConfig, ShortlistHead
from retrieval.nar.loss import NarLossWeights, nar_loss
from retrieval.nar.model import NarConfig, NarRetriever
from retrieval.nar.training import NarTrainConfig, NarTrainer, docid_targets, fit_learned_head
from retrieval.nar.trie import DocidTrie, beam_search
from retrieval.nar.vocab import PhraseVocabConfig, PhraseVocabulary

TITLES = ["red river", "blue river", "red mountain", "green valley", "blue lake", "old castle"]
QUERIES = [f"where is the {t}" for t in TITLES] + [f"tell me about {t}" for t in TITLES]
DOCS = list(range(len(TITLES))) * 2


def test_the_loss_matches_full_softmax_by_hand():
    generator = torch.Generator().manual_seed(0)
    x0, positions, weight = (torch.randn(*shape, generator=generator) for shape in ((2, 4), (2, 3, 4), (7, 4)))
    targets = torch.tensor([[3, 5, 1], [6, 1, -100]])  # end id 1
    terms = nar_loss(x0, positions, weight, targets, end_id=1, weights=NarLossWeights(0.25, 1.0), chunk=3)
    log_p = torch.log_softmax(positions @ weight.T, -1)
    lse = torch.logsumexp(positions @ weight.T, -1)
    l1 = -(log_p[0, 0, 3] + log_p[0, 1, 5] + log_p[0, 2, 1] + log_p[1, 0, 6] + log_p[1, 1, 1]) / 5
    log_q = torch.log_softmax(x0 @ weight.T, -1)
    l2 = -(log_q[0, 3] + log_q[0, 5] + log_q[1, 6]) / 3
    l3 = (lse[0, 0] ** 2 + lse[0, 1] ** 2 + lse[0, 2] ** 2 + lse[1, 0] ** 2 + lse[1, 1] ** 2) / 5
    assert torch.allclose(terms["l1"], l1, atol=1e-5) and torch.allclose(terms["l2"], l2, atol=1e-5)
    assert torch.allclose(terms["l3"], l3, atol=1e-5)
    assert torch.allclose(terms["loss"], l1 + 0.25 * l2 + l3, atol=1e-5)


@pytest.fixture(params=["pixar", "projected"])
def setup(tiny_encoder_dir, request):
    vocab = PhraseVocabulary.train(TITLES, PhraseVocabConfig(size=40, min_count=2), show_progress_bar=False)
    options = {"x0_pooling": "mean", "position_states": "projected"} if request.param == "projected" else {}
    config = NarConfig(encoder=str(tiny_encoder_dir), vocab_size=vocab.vocab_size, positions=6, **options)
    targets, encoded = docid_targets([TITLES[d] for d in DOCS], vocab, config.positions)
    return vocab, config, targets


def trainer(vocab, config, targets, output_dir, steps):
    torch.manual_seed(0)
    model = NarRetriever.from_encoder(config, vocab.tokens)
    train = NarTrainConfig(output_dir=str(output_dir), batch_size=4, max_steps=steps, save_every=2, warmup_steps=1, log_every=1,
                           train_layers=0 if config.position_states == "projected" else 1,
                           learning_rate=1e-3, output_learning_rate=1e-2)
    return NarTrainer(model, QUERIES, targets, vocab.end_id, train)


def test_training_lowers_the_loss_and_resumes_exactly(setup, tmp_path):
    vocab, config, targets = setup
    straight = trainer(vocab, config, targets, tmp_path, 4)
    straight.train()
    finished = {k: v.clone() for k, v in straight.retriever.state_dict().items()}
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert (tmp_path / "checkpoint-2" / "state" / "trainable.safetensors").is_file()  # the one loop's format
    shutil.rmtree(tmp_path / "checkpoint-4")  # as if the run had been killed after step 3
    again = trainer(vocab, config, targets, tmp_path, 4)
    again.train(resume=True)
    for (name, a), b in zip(finished.items(), again.retriever.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert log[-1]["loss"] < log[0]["loss"]


def test_save_and_load_round_trip(setup, tmp_path):
    vocab, config, _ = setup
    model = NarRetriever.from_encoder(config, vocab.tokens)
    model.save_pretrained(tmp_path / "nar")
    again = NarRetriever.from_pretrained(tmp_path / "nar")
    assert torch.equal(again.output, model.output) and again.config == model.config
    for (name, a), b in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(a, b), name
    for a, b in zip(model.encoder.state_dict().values(), again.encoder.state_dict().values()):
        assert torch.equal(a, b)


def test_a_shortlist_that_probes_everything_searches_as_the_full_softmax(setup):
    vocab, config, targets = setup
    model = NarRetriever.from_encoder(config, vocab.tokens).eval()
    trie = DocidTrie.build(vocab.encode_batch(TITLES), vocab.end_id)
    head = ShortlistHead.from_vectors(model.output.detach(), ShortlistConfig(num_clusters=4, probe=4, subset_size=3))
    full, stats = model.search(QUERIES, trie, None, beam_size=4)
    short, short_stats = model.search(QUERIES, trie, head, beam_size=4)
    assert torch.equal(full.docids, short.docids) and torch.allclose(full.scores, short.scores, atol=1e-5)
    assert stats.candidates == vocab.vocab_size and short_stats.candidates <= vocab.vocab_size
    learned = fit_learned_head(model, QUERIES, targets, vocab.end_id, ShortlistConfig(num_clusters=3, probe=1, subset_size=5),
                               steps=5, batch_size=4)
    assert learned.vocab_size == vocab.vocab_size and learned.num_clusters == 3


def test_dense_scores_search_as_all_ids_listed():
    trie = DocidTrie.build([[2, 3], [3], [4, 2]], end_id=1)
    scores = torch.log_softmax(torch.randn(2, 3, 5), -1)
    listed = beam_search(trie, torch.arange(5).expand(2, 5).contiguous(), scores, 3)
    dense = beam_search(trie, None, scores, 3)
    assert torch.equal(listed.docids, dense.docids) and torch.equal(listed.scores, dense.scores)
