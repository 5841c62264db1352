"""The LM's document states kept beside an index: the pipeline's and the server's state gate read them, not the LM."""

import logging
from unittest import mock

import pytest
import torch

from dynvocab import DynamicVocabLM
from dynvocab.states.keys import row_state_keys
from dynvocab.states.store import DocumentStates
from retrieval import DocumentIndex
from retrieval.config import PipelineConfig
from retrieval.document_states import attach_document_states, build_document_states, document_token_ids, states_path
from retrieval.pipeline import _DOCUMENT_STATES, PhrasePipeline
from tests.helpers import HashEncoder, PreferPhrases, tiny_llama
from tests.retrieval.test_phrase_vectors import MORE

PROMPTS = ["Which river flows through Rome?", "Tell me about Egypt. Cairo"]


@pytest.fixture
def index(tmp_path):
    DocumentIndex.build(MORE, HashEncoder(), index_type="flat").save(tmp_path / "index")
    return DocumentIndex.load(tmp_path / "index", encoder=HashEncoder())


def lm_calls(lm) -> list:
    """The tokens of each call of the LM's decoder."""
    calls = []
    def heard(module, args, kwargs, out):
        read = kwargs.get("input_ids")
        calls.append((read if read is not None else kwargs["inputs_embeds"]).shape[1])

    lm.get_decoder().register_forward_hook(heard, with_kwargs=True)
    return calls


def test_the_pipelines_keys_are_read_from_the_store_and_equal_the_lms(llama, tokenizer, index):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    store = build_document_states(DocumentStates(model.lm, max_bytes=0), tokenizer, index, dtype="float32",
                                  shard_documents=2)
    assert store.directory == states_path(index.directory) and len(store) == len(MORE)
    config = PipelineConfig(grounded=False, top_k=2, max_new_tokens=3, agreement_top_k=0, state_threshold=-1.0)
    pipeline = PhrasePipeline(model, index, config)
    documents = index.search_documents(PROMPTS, k=2)
    phrases = [pipeline.candidates(found) for found in documents]
    model.set_phrases(phrases, mid_sentence_forms=False)
    calls = lm_calls(model.lm)
    keys = pipeline.state_keys(documents, phrases)
    states = _DOCUMENT_STATES[model.lm]
    assert calls == [] and [s.directory for s in states.stores] == [store.directory]
    assert (states.loaded, states.misses) == (len({d["id"] for found in documents for d in found}), 0)
    ids = [document_token_ids(tokenizer, found) for found in documents]
    read = row_state_keys(model.lm, model.phrase_table, ids, [[p.text for p in found] for found in phrases], -1.0)
    assert torch.equal(keys.phrases, read.phrases) and torch.equal(keys.rows, read.rows)
    assert torch.allclose(keys.keys, read.keys, atol=1e-5)
    model.scorer = PreferPhrases()
    assert all(result.phrase_steps == result.steps for result in pipeline.batch(PROMPTS))
    assert states.misses == 0  # generating, the LM read no document either


def test_grounded_decoding_reads_the_documents_keys_and_values_from_the_store(llama, tokenizer, index):
    from dynvocab.states.kv import DocumentKV
    from retrieval.document_states import build_document_kv
    from retrieval.pipeline import _DOCUMENT_KV
    from retrieval.reading import document_context_ids

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    store = build_document_kv(DocumentKV(llama, max_bytes=0), tokenizer, index, read_tokens=16, dtype="float32",
                              shard_documents=2)
    assert store.directory == states_path(index.directory, DocumentKV(llama)) and len(store) == len(MORE)
    config = PipelineConfig(top_k=2, read_documents=2, read_tokens=16, max_new_tokens=4, document_kv=1,
                            draft_step_cost=0.0)  # not measured here: the LM reads only the prompts
    calls = lm_calls(llama)
    results = PhrasePipeline(model, index, config).batch(PROMPTS)
    kv = _DOCUMENT_KV[llama]
    assert [s.directory for s in kv.stores] == [store.directory] and kv.misses == 0  # found in the store, or kept
    assert kv.loaded + kv.hits == len(PROMPTS) and kv.loaded == len({r.documents[0]["id"] for r in results})
    # each prompt's first LM call read its second document and its prompt: never the first document
    for result, prompt in zip(results, PROMPTS):
        first, second = document_context_ids(tokenizer, result.documents[:2], 16)
        assert result.text and len(second) + len(tokenizer(prompt, add_special_tokens=False).input_ids) in calls
        assert max(calls) < len(first) + len(second)


@pytest.mark.parametrize(("dtype", "stored"), [("float32", 1), ("float16", 0)])
def test_grounded_decoding_reads_the_first_document_from_a_float32_store_by_default(llama, tokenizer, index, dtype,
                                                                                     stored):
    from dynvocab.states.kv import DocumentKV
    from retrieval.document_states import build_document_kv

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    pipeline = PhrasePipeline(model, index, PipelineConfig(top_k=2, read_documents=2, read_tokens=16))
    assert pipeline.config.document_kv is None and pipeline.stored_documents() == 0  # no store beside the index yet
    build_document_kv(DocumentKV(llama, max_bytes=0), tokenizer, index, read_tokens=16, dtype=dtype)
    # float32: the first document's keys and values are the LM's own, so the text is the same; float16 would change it
    assert pipeline.stored_documents() == stored
    kv = pipeline.document_kv()
    taken = kv.loaded + kv.hits
    pipeline.config = PipelineConfig(top_k=2, read_documents=2, read_tokens=16, max_new_tokens=4)
    assert all(result.text for result in pipeline.batch(PROMPTS))
    assert kv.loaded + kv.hits - taken == stored * len(PROMPTS) and kv.misses == 0  # each first document, from the store
    for settings in ({"document_kv": 0}, {"grounded": False}):
        assert PhrasePipeline(model, index, PipelineConfig(top_k=2, **settings)).stored_documents() == 0


def test_an_lm_without_rotary_embeddings_reads_every_document_itself_beside_a_store(tokenizer, index):
    from retrieval.document_states import KV_FOLDER
    from tests.helpers import tiny_gpt2

    (index.directory / KV_FOLDER).mkdir()
    model = DynamicVocabLM.from_causal_lm(tiny_gpt2(len(tokenizer)), tokenizer).eval()
    pipeline = PhrasePipeline(model, index, PipelineConfig(top_k=2, read_documents=2, read_tokens=16, max_new_tokens=4))
    assert pipeline.stored_documents() == 0 and pipeline(PROMPTS[0]).text


def test_a_store_of_another_lm_is_left_alone_and_said(llama, tokenizer, index, caplog):
    build_document_states(DocumentStates(llama, max_bytes=0), tokenizer, index)
    other_lm = tiny_llama(len(tokenizer), seed=1)
    states = DocumentStates(other_lm)
    caplog.set_level(logging.INFO, logger="retrieval.document_states")
    assert attach_document_states(states, index) is None and states.stores == []
    assert "another LM" in caplog.text and "the LM reads each retrieved document itself" in caplog.text
    caplog.clear()  # asked again (the eval makes a pipeline per batch): not opened, not said again
    with mock.patch("retrieval.document_states.DocumentStateStore", side_effect=AssertionError("opened again")):
        assert attach_document_states(states, index) is None
    assert caplog.text == ""
    states = DocumentStates(llama)
    assert attach_document_states(states, index) is attach_document_states(states, index) is states.stores[0]
    assert "other documents" not in caplog.text
    index.documents.append({"id": "lima", "title": "Lima", "text": "Lima is the capital of Peru."})
    assert attach_document_states(DocumentStates(llama), index) is not None  # used, and said: fewer will be found
    assert "computed for other documents than the index now holds" in caplog.text and "--overwrite" in caplog.text


def test_the_server_reads_its_corpus_states_from_the_store(make_engine_on, llama, tokenizer, index):
    build_document_states(DocumentStates(llama, max_bytes=0), tokenizer, index)
    engine = make_engine_on(llama, tokenizer, {"wiki": index})
    assert [s.directory for s in engine.document_states.stores] == [states_path(index.directory)]


def test_the_servers_grounded_requests_read_the_first_document_from_a_float32_store(make_engine_on, llama, tokenizer,
                                                                                    index):
    """A served corpus with a float32 store beside its index: a grounded request that retrieves from it takes its
    first document's keys and values from the store, alone or batched (the LM reads only the second document and the
    prompt), and writes what it writes reading both; ``document_kv: 0`` reads both."""
    from dynvocab.states.kv import DocumentKV
    from retrieval.document_states import build_document_kv
    from dynvocab.serving.engine.errors import ApiError
    from dynvocab.serving.engine.requests import CompletionRequest
    from retrieval.document_states import stored_documents
    from retrieval.reading import document_context_ids
    from tests.dynvocab.serving.test_batching import job

    def run(engine, *extras: dict) -> list[str]:
        """``PROMPTS`` in one batch, each request with its own extra fields (default: none)."""
        requests = [{"prompt": prompt, "max_tokens": 6, "retrieve": 2, "grounded": True, "read_tokens": 16, **extra}
                    for prompt, extra in zip(PROMPTS, extras or [{}] * len(PROMPTS))]
        return [completion.text for completion in engine.run([job(engine, fields, n) for n, fields in enumerate(requests)])]

    read_both = run(make_engine_on(llama, tokenizer, {"wiki": index}))
    build_document_kv(DocumentKV(llama, max_bytes=0), tokenizer, index, read_tokens=16)
    engine = make_engine_on(llama, tokenizer, {"wiki": index})
    kv = engine.document_kv
    assert [store.directory for store in kv.stores] == [states_path(index.directory, kv)]  # found at start-up
    calls = lm_calls(llama)
    assert run(engine) == read_both and all(read_both)
    firsts = {found[0]["id"] for found in index.search_documents(PROMPTS, k=2)}
    assert (kv.loaded, kv.misses) == (len(firsts), 0)  # every first document, from the store
    for found, prompt in zip(index.search_documents(PROMPTS, k=2), PROMPTS):  # each row read alone: its second
        first, second = document_context_ids(tokenizer, found, 16)  # document and its prompt, never its first
        assert len(second) + len(tokenizer(prompt, add_special_tokens=False).input_ids) in calls
        assert max(calls) < len(first) + len(second)
    assert run(engine, {"document_kv": 0}, {"document_kv": 0}) == read_both
    assert (kv.loaded + kv.hits, kv.misses) == (len(firsts), 0)  # the LM read both: nothing taken from the store
    assert run(engine, {"document_kv": 0}, {}) == read_both  # a row reading both beside one joining with its cache
    assert kv.loaded + kv.hits == len(firsts) + 1
    request = CompletionRequest.model_validate({"prompt": PROMPTS[0], "retrieve": 2, "read_tokens": kv.max_tokens + 1})
    corpora = engine.corpora.values()  # by default such documents are read by the LM: longer than those kept
    assert stored_documents(engine.check(request).settings, kv, corpora) == 0
    assert stored_documents(engine.check(request.model_copy(update={"read_tokens": 16})).settings, kv, corpora) == 1
    with pytest.raises(ApiError) as refused:
        engine.check(request.model_copy(update={"document_kv": 1}))
    assert refused.value.param == "document_kv" and f"read_tokens of at most {kv.max_tokens}" in refused.value.message


def test_a_server_on_an_lm_without_rotary_embeddings_refuses_document_kv(make_engine_on, tokenizer, index):
    from dynvocab.serving.engine.errors import ApiError
    from dynvocab.serving.engine.requests import CompletionRequest
    from tests.helpers import tiny_gpt2

    engine = make_engine_on(tiny_gpt2(len(tokenizer)), tokenizer, {"wiki": index})
    assert engine.document_kv is None
    request = CompletionRequest.model_validate({"prompt": PROMPTS[0], "retrieve": 2, "document_kv": 1})
    with pytest.raises(ApiError) as refused:
        engine.check(request)
    assert (refused.value.status, refused.value.param) == (400, "document_kv") and "send 0" in refused.value.message
    assert engine.check(request.model_copy(update={"document_kv": None})).settings.document_kv is None


@pytest.fixture
def make_engine_on():
    from dynvocab.serving import ServerConfig
    from dynvocab.serving.engine.engine import Engine

    def make(lm, tokenizer, corpora):
        return Engine(DynamicVocabLM.from_causal_lm(lm, tokenizer).eval(), corpora, "tiny", ServerConfig(index="none"))

    return make


def test_the_servers_grounded_requests_fill_from_their_served_corpus(make_engine_on, llama, tokenizer, index,
                                                                    monkeypatch):
    """A grounded request that retrieves from a served corpus fills the steps its documents leave empty from that
    corpus: the same text in fewer LM calls; ``fill_tokens: 0`` does not fill."""
    import dynvocab.serving.engine.engine as engine_module
    from dynvocab.decoding import CorpusDrafts
    from tests.dynvocab.serving.test_batching import job

    def run(engine, **extra) -> list[str]:
        requests = [{"prompt": prompt, "max_tokens": 12, "retrieve": 2, "grounded": True, "read_tokens": 16,
                     "document_kv": 0, "no_repeat_ngram_size": 0, **extra} for prompt in PROMPTS]
        return [completion.text for completion in engine.run([job(engine, fields, n) for n, fields in enumerate(requests)])]

    engine = make_engine_on(llama, tokenizer, {"wiki": index})
    plain = run(engine, fill_tokens=0)
    written = CorpusDrafts(tokenizer([p + t for p, t in zip(PROMPTS, plain)], add_special_tokens=False).input_ids)
    asked = []
    monkeypatch.setattr(engine_module, "corpus_drafts", lambda corpus, tokenizer: asked.append(corpus) or written)
    calls = lm_calls(llama)
    assert run(engine, fill_tokens=0) == plain and not asked
    unfilled = len(calls)
    calls.clear()
    assert run(engine) == plain and asked and all(corpus is index for corpus in asked)  # fills by default
    assert len(calls) < unfilled
