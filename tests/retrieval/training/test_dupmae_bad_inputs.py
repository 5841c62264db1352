"""Bad inputs to the DupMAE encoder, hybrid index, trainers and retrieval evaluation: one clear error each."""

import numpy as np
import pytest

from dynvocab.hardware.precision import mixed_precision
from encoders.dupmae import DupMAEConfig, load_masked_lm
from encoders.hybrid import HybridEncoder, HybridEncoderConfig, HybridVectors
from evals.retrieval.config import RetrievalEvalConfig
from retrieval.index.hybrid import HybridIndex
from retrieval.training.finetuning import FinetuneConfig
from retrieval.training.fusion import choose_sparse_weight
from retrieval.training.pairs import training_pairs
from retrieval.training.pretraining import PretrainConfig
from tests.tiny_mlm import save_tiny_mlm


def vectors(n=3, dense=4, k=2, top=10):
    return HybridVectors(np.ones((n, dense), np.float32), np.tile(np.arange(k), (n, 1)) % top, np.ones((n, k), np.float32))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return HybridEncoder.from_pretrained(str(save_tiny_mlm(tmp_path_factory.mktemp("m"))), dense_dim=4)


@pytest.fixture(scope="module")
def index():
    return HybridIndex.build(["a", "b", "c"], vectors=vectors(), vocab_size=10)


CASES = [
    (lambda e, i: DupMAEConfig(encoder_mask_ratio=1.5), ValueError, "encoder_mask_ratio=1.5 must be a fraction"),
    (lambda e, i: DupMAEConfig(decoder_mask_ratio=0), ValueError, "decoder_mask_ratio=0 must be a fraction"),
    (lambda e, i: DupMAEConfig(bow_weight=-1), ValueError, "bow_weight=-1 must be a number >= 0"),
    (lambda e, i: load_masked_lm("/no/such/model/folder"), ValueError, "no model folder at '/no/such/model/folder'"),
    (lambda e, i: load_masked_lm(None), TypeError, "name_or_path=None must be a Hub name"),
    (lambda e, i: HybridEncoderConfig(sparse_k=-3), ValueError, "sparse_k=-3 must be an int >= 0"),
    (lambda e, i: HybridEncoderConfig(use_dense=False, sparse_k=0), ValueError, "leaves no representation"),
    (lambda e, i: e.with_representation("dense"), ValueError, "representation='dense' is not one of"),
    (lambda e, i: e.encode(["ok", 3]), TypeError, "texts[1] is int"),
    (lambda e, i: e.encode(["ok"], batch_size=0), ValueError, "batch_size=0 must be a positive int"),
    (lambda e, i: i.search(vectors(), k=0), ValueError, "k=0 must be a positive int"),
    (lambda e, i: i.search(["text"], k=2), ValueError, "this index has no encoder"),
    (lambda e, i: i.search(np.ones((2, 4), np.float32), k=2), TypeError, "queries is a ndarray"),
    (lambda e, i: i.search(vectors(dense=5), k=2), ValueError, "have dimension 5 but the index has 4"),
    (lambda e, i: i.search(HybridVectors(np.ones((1, 4), np.float32), np.array([[12]]), np.ones((1, 1), np.float32)), 2),
     ValueError, "past the index's vocabulary of 10"),
    (lambda e, i: HybridIndex.build([], vectors=vectors(), vocab_size=10), ValueError, "holds no documents"),
    (lambda e, i: HybridIndex.build(["a", "b"], vectors=vectors(), vocab_size=10), ValueError, "got 3 vectors for 2 documents"),
    (lambda e, i: HybridIndex.build(["a", "b", "c"], vectors=np.ones((3, 4))), TypeError, "vectors is a ndarray; pass HybridVectors"),
    (lambda e, i: HybridIndex.build(["a", "b", "c"], vectors=vectors(), vocab_size=None), ValueError, "vocab_size is None"),
    (lambda e, i: HybridIndex.build(["a", "b", "c"], vectors=HybridVectors(np.ones((3, 4), np.float32), np.ones((3, 1), np.int64),
                                                                         np.full((3, 1), np.nan, np.float32)), vocab_size=10),
     ValueError, "NaN or infinite"),
    (lambda e, i: HybridIndex(i.dense, i.sparse, i.documents, candidates=0), ValueError, "candidates=0 must be a positive int"),
    (lambda e, i: HybridIndex(i.dense, i.sparse, i.documents, query_terms=0), ValueError, "query_terms=0 must be a positive int"),
    (lambda e, i: HybridIndex.build(["a", "b", "c"], vectors=vectors(), vocab_size=10, posting_terms=0), ValueError,
     "posting_terms=0 must be a positive int"),
    (lambda e, i: HybridIndex.load("/no/such/index"), ValueError, "no saved index at '/no/such/index'"),
    (lambda e, i: PretrainConfig(batch_size=0), ValueError, "batch_size=0 must be a positive int"),
    (lambda e, i: PretrainConfig(encoder_mask_ratio=0.0), ValueError, "encoder_mask_ratio=0.0 must be a fraction"),
    (lambda e, i: FinetuneConfig(encoder="sparse"), ValueError, "encoder='sparse'; choose one of"),
    (lambda e, i: FinetuneConfig(batch_size=1), ValueError, "leaves no in-batch negatives"),
    (lambda e, i: FinetuneConfig(temperature=0.0), ValueError, "temperature=0.0 must be > 0"),
    (lambda e, i: FinetuneConfig(anchor_weight=-0.5), ValueError, "anchor_weight=-0.5 must be a number >= 0"),
    (lambda e, i: FinetuneConfig(fusion_queries=-1), ValueError, "fusion_queries=-1 must be an int >= 0; 0 keeps"),
    (lambda e, i: FinetuneConfig(fusion_documents=0), ValueError, "fusion_documents=0 must be a positive int"),
    (lambda e, i: choose_sparse_weight(e, [], []), ValueError, "no held-out queries to choose the fusion weight on"),
    (lambda e, i: mixed_precision("fp8"), ValueError, "mixed_precision='fp8'"),
    (lambda e, i: training_pairs(["just a string"]), TypeError, "documents must be a list of"),
    (lambda e, i: RetrievalEvalConfig(corpus="msmarco"), ValueError, "corpus='msmarco'; choose"),
    (lambda e, i: RetrievalEvalConfig(seeds="a,b"), ValueError, "seeds='a,b' must be comma-separated ints"),
]


@pytest.mark.parametrize("call, error, fragment", CASES, ids=[c[2][:40] for c in CASES])
def test_bad_input_raises_clear_error(encoder, index, call, error, fragment):
    with pytest.raises(error) as raised:
        call(encoder, index)
    assert fragment in str(raised.value)
