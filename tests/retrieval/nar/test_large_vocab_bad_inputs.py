"""Bad input at every public door of the shortlist head, the docid trie, the phrase vocabulary and the NAR retriever:
one row per (call, error type, message fragment)."""

import pytest
import torch

from dynvocab import ShortlistConfig, ShortlistHead, ShortlistScorer
from dynvocab.scoring.shortlist_head import chunked_logsumexp
from retrieval.nar.loss import NarLossWeights, nar_loss
from retrieval.nar.model import NarConfig, local_or_hub
from retrieval.nar.recipes import nar_search, read_docids
from retrieval.nar.training import NarTrainConfig
from retrieval.nar.trie import BeamResult, DocidTrie, aggregate_documents, beam_search
from retrieval.nar.vocab import PhraseVocabConfig, PhraseVocabulary, train_baseline

VECTORS = torch.randn(40, 8)


def head() -> ShortlistHead:
    return ShortlistHead.from_vectors(VECTORS, ShortlistConfig(num_clusters=4, probe=2, subset_size=3))


def trie() -> DocidTrie:
    return DocidTrie.build([[2, 3], [4]], end_id=1)


CASES = [
    (lambda: ShortlistConfig(probe=0), ValueError, "ShortlistConfig.probe=0 must be an integer >= 1"),
    (lambda: ShortlistConfig(num_clusters=-3), ValueError, "ShortlistConfig.num_clusters=-3"),
    (lambda: ShortlistConfig(subset_size=2.5), ValueError, "subset_size=2.5 must be an integer"),
    (lambda: ShortlistHead.from_vectors([[1.0, 2.0]]), TypeError, "vectors must be a torch.Tensor"),
    (lambda: ShortlistHead.from_vectors(torch.zeros(0, 8)), ValueError, "it must be (n, d) with n >= 1"),
    (lambda: ShortlistHead.from_vectors(torch.ones(5, 4, dtype=torch.long)), TypeError, "pass floating-point vectors"),
    (lambda: head().add(torch.randn(3, 5)), ValueError, "it must be (n, 8)"),
    (lambda: head().keep([0, 99]), ValueError, "indices must lie in [0, 40)"),
    (lambda: head().score(torch.randn(2, 8), VECTORS[:30]), ValueError, "the head indexes 40 vectors but got 30"),
    (lambda: ShortlistHead.learned(torch.randn(6, 8), torch.zeros(6, 2), VECTORS), ValueError, "must be a (N, L) long tensor"),
    (lambda: ShortlistHead.learned(torch.randn(6, 8), torch.full((6, 2), 99), VECTORS), ValueError, "ids below 40"),
    (lambda: ShortlistHead.load("/nonexistent/head"), FileNotFoundError, "manifest.json is missing"),
    (lambda: chunked_logsumexp(torch.randn(2, 8), VECTORS, chunk=0), ValueError, "chunk=0 must be >= 1"),
    (lambda: ShortlistScorer([]), TypeError, "table must be the model's PhraseTable"),
    (lambda: DocidTrie.build([[2, 1]], end_id=1), ValueError, "without end_id 1"),
    (lambda: DocidTrie.build([[]], end_id=1), ValueError, "must be a non-empty list"),
    (lambda: DocidTrie.build([], end_id=1), ValueError, "docids is empty"),
    (lambda: DocidTrie.build([[2]], end_id=-1), ValueError, "end_id=-1 must be a non-negative"),
    (lambda: beam_search(trie(), None, torch.randn(2, 5), 3), ValueError, "must be (B, C) and (B, s, C)"),
    (lambda: beam_search(trie(), None, torch.randn(1, 3, 5), 0), ValueError, "beam_size=0 must be an integer >= 1"),
    (lambda: beam_search(trie(), [[1, 2]], torch.randn(1, 3, 2), 2), TypeError, "must be torch tensors"),
    (lambda: aggregate_documents(BeamResult(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1)), torch.zeros(1, dtype=torch.long), "mean"),
     ValueError, "how='mean'; choose 'max' or 'sum'"),
    (lambda: PhraseVocabConfig(size=3), ValueError, "must exceed the 3 special tokens"),
    (lambda: PhraseVocabConfig(prune_fraction=0.0), ValueError, "prune_fraction=0.0 must be in (0, 1]"),
    (lambda: PhraseVocabulary.train([]), ValueError, "docids is empty"),
    (lambda: PhraseVocabulary.train(["ok", 7]), TypeError, "every docid must be a non-empty str, got 7"),
    (lambda: PhraseVocabulary.train(["abcdefghij"], PhraseVocabConfig(size=5)), ValueError, "size=5 is below the 13"),
    (lambda: PhraseVocabulary.train(["ab"], PhraseVocabConfig(size=8)).encode(b"ab"), TypeError, "text must be a str"),
    (lambda: train_baseline("wordpiece", ["a b"], 10), ValueError, "kind='wordpiece'; choose 'bpe' or 'unigram'"),
    (lambda: NarConfig(positions=0), ValueError, "NarConfig.positions=0 must be an integer >= 1"),
    (lambda: NarConfig(vocab_size=2), ValueError, "NarConfig.vocab_size=2 must be an integer >= 4"),
    (lambda: NarTrainConfig(batch_size=0), ValueError, "NarTrainConfig.batch_size=0 must be an integer >= 1"),
    (lambda: NarTrainConfig(mixed_precision="fp8"), ValueError, "mixed_precision='fp8'; choose 'no', 'bf16' or 'auto'"),
    (lambda: NarTrainConfig(train_layers=-2), ValueError, "train_layers=-2 must be -1 (all)"),
    (lambda: NarLossWeights(docid_weight=-1.0), ValueError, "docid_weight=-1.0 must be >= 0"),
    (lambda: nar_loss(torch.randn(1, 4), torch.randn(1, 2, 4), torch.randn(5, 4), torch.full((1, 2), -100), 1),
     ValueError, "every target is -100"),
    (lambda: nar_loss(torch.randn(1, 4), torch.randn(1, 2, 4), torch.randn(5, 4), torch.zeros(1, 3, dtype=torch.long), 1),
     ValueError, "must be (B, s) = (1, 2)"),
    (lambda: local_or_hub("/nonexistent/encoder"), FileNotFoundError, "path '/nonexistent/encoder' does not exist"),
    (lambda: read_docids("/nonexistent/docids.txt"), FileNotFoundError, "is neither 'wikipedia' nor a file"),
    (lambda: nar_search("/nonexistent/run", ["q"], False, 10, 20), FileNotFoundError, "pass the --output-dir of"),
]


@pytest.mark.parametrize(("call", "error", "fragment"), CASES, ids=[c[2][:40] for c in CASES])
def test_bad_input_is_refused_with_a_message_that_says_why(call, error, fragment):
    with pytest.raises(error) as caught:
        call()
    assert fragment in str(caught.value)
