"""``load_engine``: a served index folder that holds phrase vectors has the model read them."""

import copy
import gc

from dynvocab.serving import ServerConfig
from dynvocab.serving.http import server
from retrieval import DocumentIndex
from retrieval.config import PipelineConfig
from retrieval.loading import document_encoder
from retrieval.phrase_vectors import build_phrase_vectors
from retrieval.pipeline import PhrasePipeline
from tests.helpers import count_encoded

from .documents import DOCS


def test_the_served_index_phrase_vectors_are_read_not_encoded(tmp_path, monkeypatch, _tiny_model, tiny_lm_dir,
                                                              tiny_encoder_dir):
    folder = tmp_path / "wiki"
    DocumentIndex.build(DOCS, document_encoder(str(tiny_encoder_dir)), index_type="flat").save(folder)
    model = copy.deepcopy(_tiny_model)
    build_phrase_vectors(model, DocumentIndex.load(folder), PipelineConfig(grounded=False))
    monkeypatch.setattr(server, "load_dynamic_lm", lambda name, checkpoint: model)
    engine = server.load_engine(ServerConfig(model=str(tiny_lm_dir), index=str(folder), encoder=str(tiny_encoder_dir)))
    assert engine.model.phrase_store is not None and len(engine.model.phrase_store) > 0
    assert gc.get_freeze_count() > 0  # what it loaded is out of the garbage collector's full collections
    calls = count_encoded(engine.model)
    documents = engine.corpora["wiki"].documents[:1]  # a request's documents: their phrases are all stored
    engine.model.set_phrases(PhrasePipeline(engine.model, None).candidates(documents), mid_sentence_forms=False)
    assert calls == [] and engine.model.phrase_store.hits == len(engine.model.phrase_table) > 0
