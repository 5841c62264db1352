import numpy as np
import pytest

from dynvocab import DotProductScorer, DynamicVocabLM, Phrase
from retrieval import DocumentIndex, reading
from retrieval.config import FIXED_DRAFT_STEP_COST, PipelineConfig
from retrieval.pipeline import _DOCUMENT_STATES, PhrasePipeline
from retrieval.reading import _DRAFT_STEP_COSTS
from tests.helpers import PreferPhrases

DOCS = [
    {"id": "nyc", "title": "New York", "text": "New York City is the most populous city in the United States. New York City lies on the Hudson River."},
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France. The Seine river flows through Paris."},
    {"id": "tokyo", "title": "Tokyo", "text": "Tokyo is the capital of Japan. Greater Tokyo is the largest metropolitan area."},
]


class WordHashEncoder:
    """A bag-of-words encoder with exact, known nearest neighbours."""

    name, dim = "word-hash", 64

    def encode(self, texts, batch_size=32, show_progress_bar=None):
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().replace(".", " ").split():
                vectors[row, sum(map(ord, word)) % self.dim] += 1.0
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture
def pipeline(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    index = DocumentIndex.build(DOCS, WordHashEncoder(), index_type="flat")
    return PhrasePipeline(model, index, PipelineConfig(grounded=False, top_k=1, max_new_tokens=12, agreement_top_k=0))


def test_phrases_come_from_the_retrieved_document_and_keep_their_source(pipeline):
    result = pipeline("Which river flows through New York City?")
    assert [d["id"] for d in result.documents] == ["nyc"]
    assert result.num_phrases > 0
    assert {p.source for p in pipeline.model.phrases} == {"nyc"}
    assert " New York City" in {p.text for p in pipeline.model.phrases}
    assert set(result.latency) == {"retrieve", "extract", "encode", "decode"}
    assert all(seconds > 0 for seconds in result.latency.values())
    assert result.text == pipeline.model.decode(pipeline.model.tokenize(result.text))


def test_cited_spans_are_marked(pipeline):
    pipeline.model.scorer = PreferPhrases()
    result = pipeline("Which river flows through New York City?")
    assert result.phrase_steps == result.steps
    assert result.marked().startswith("[") and "]^1" in result.marked()


def test_a_batch_cites_each_row_from_its_own_documents(pipeline):
    pipeline.model.scorer = PreferPhrases()
    pipeline.config = PipelineConfig(grounded=False, top_k=1, max_new_tokens=6, agreement_top_k=0, phrase_max_uses=0)
    # both documents hold " is the capital of": one text, a different source in each row
    pipeline.candidates = lambda documents: [Phrase(" is the capital of", documents[0]["id"])]
    results = pipeline.batch(["Tell me about France. Paris", "Tell me about Japan. Tokyo"])
    for result, expected in zip(results, ("paris", "tokyo")):
        assert [d["id"] for d in result.documents] == [expected]
        assert result.phrase_steps and {s.source for s in result.segments if s.is_phrase} == {expected}


def test_realtime_mode_adds_phrases_during_decoding(pipeline):
    pipeline.config = PipelineConfig(grounded=False, top_k=1, max_new_tokens=12, realtime=True, realtime_every=4, realtime_fraction=0.1)
    result = pipeline("Which river flows through New York City?")
    chunk = max(1, round(result.num_phrases * 0.1))
    assert len(pipeline.model.phrases) == min(result.num_phrases, 3 * chunk)
    assert result.steps == 12


def test_realtime_drop_unused_keeps_generated_phrases_readable(pipeline):
    class PreferFirst(DotProductScorer):
        def forward(self, hidden, vectors, mask=None):
            scores = super().forward(hidden, vectors, mask)
            scores[..., 0] += 1e4
            return scores

    pipeline.model.scorer = PreferFirst()
    pipeline.config = PipelineConfig(grounded=False,
        top_k=1, max_new_tokens=8, realtime=True, realtime_every=2, realtime_fraction=0.2, drop_unused=True,
        agreement_top_k=0, no_repeat_ngram_size=0, phrase_max_uses=0,
    )
    result = pipeline("Which river flows through New York City?")
    first = pipeline.candidates(result.documents)[0].text
    assert result.text == first * 8
    pipeline.config.phrase_max_uses = 3  # counted across chunks, through the renumbering of dropped phrases
    result = pipeline("Which river flows through New York City?")
    assert [s.text for s in result.segments if s.is_phrase].count(first) == 3 and result.text.startswith(first * 3)


def test_a_batch_gives_each_prompt_its_own_phrases_and_budget(pipeline):
    pipeline.model.scorer = PreferPhrases()  # a masked phrase stays at -inf
    prompts = ["Which river flows through New York City?", "Tokyo"]
    results = pipeline.batch(prompts, max_chars=[30, 10])
    assert [r.documents[0]["id"] for r in results] == ["nyc", "tokyo"]
    for result, budget in zip(results, (30, 10)):  # every step is a phrase of the row's own document
        assert result.phrase_steps == result.steps > 0
        assert {s.source for s in result.segments} == {result.documents[0]["id"]}
        assert budget <= len(result.text) < budget + 40  # stops at the first step past its budget


def test_a_batch_matches_one_prompt_at_a_time_under_greedy_decoding(pipeline):
    prompts = ["Which river flows through New York City?", "The capital of Japan"]
    alone = [pipeline(p).text for p in prompts]
    assert [r.text for r in pipeline.batch(prompts)] == alone


def test_verified_decoding_keeps_rows_budgets_and_counts_steps(pipeline):
    pipeline.config = PipelineConfig(grounded=False, top_k=1, max_new_tokens=10, verify_top_k=2, agreement_top_k=0)
    prompts = ["Which river flows through New York City?", "Where is the Eiffel Tower?"]
    results = pipeline.batch(prompts, max_chars=[20, 30])
    for result, budget in zip(results, [20, 30]):
        assert 1 <= result.steps <= 10
        assert len(result.text) >= budget or result.steps == 10
        assert result.steps <= len(pipeline.model.tokenizer(result.text, add_special_tokens=False).input_ids) + 1


def test_drafts_from_the_retrieved_documents_leave_the_verified_text_as_it_is(pipeline):
    settings = {"top_k": 1, "max_new_tokens": 40, "verify_top_k": 1, "agreement_top_k": 1, "phrase_max_uses": 0}
    prompts = ["Which river flows through New York City?", "Where is the Eiffel Tower?"]
    pipeline.config = PipelineConfig(grounded=False, **settings)
    plain = pipeline.batch(prompts, max_chars=[40, 60])
    pipeline.config = PipelineConfig(grounded=False, **settings, draft_tokens=4)
    drafted = pipeline.batch(prompts, max_chars=[40, 60])
    assert [r.text for r in drafted] == [r.text for r in plain]  # the same text, cut at the same budget
    assert all(d.steps <= p.steps for d, p in zip(drafted, plain))
    measured = _DRAFT_STEP_COSTS[pipeline.model][4]  # measured on this machine at the first drafted request
    assert pipeline.drafter([DOCS[0]]).step_cost == measured >= 0.0
    pipeline.config = PipelineConfig(grounded=False, **settings, draft_tokens=4, draft_step_cost=0.0)  # draft whenever a context matches
    tokens = pipeline.model.tokenizer
    drafter = pipeline.drafter([DOCS[0]])  # what the first prompt's drafts come from
    after = tokens(" city in the", add_special_tokens=False).input_ids
    assert drafter.draft(after) == tokens(" United States. New York", add_special_tokens=False).input_ids[:4]

def test_first_token_mass_lets_a_phrase_start_only_where_the_lm_would(pipeline):
    prompt = "Which river flows through New York City?"
    pipeline.config = PipelineConfig(grounded=False, top_k=1, max_new_tokens=1, max_phrases=0)
    lm_first = pipeline(prompt).text
    pipeline.model.scorer = PreferPhrases()
    pipeline.config = PipelineConfig(grounded=False, top_k=1, max_new_tokens=1, agreement_top_k=0, phrase_max_uses=0)
    assert pipeline.config.generation_kwargs().get("phrase_first_token_mass") is None
    assert pipeline(prompt).phrase_steps == 1  # an over-scored phrase takes the step, whatever its first token
    for verify_top_k in (0, 2):
        pipeline.config = PipelineConfig(grounded=False, top_k=1, max_new_tokens=1, agreement_top_k=0, phrase_max_uses=0,
                                         first_token_mass=True, verify_top_k=verify_top_k)
        assert pipeline(prompt).text.startswith(lm_first)


def test_the_phrase_guards_default_by_decoding_and_explicit_values_win():
    from retrieval.config import DECODING_DEFAULTS

    greedy, sampled = PipelineConfig(grounded=False).generation_kwargs(), PipelineConfig(grounded=False, do_sample=True).generation_kwargs()
    assert greedy["phrase_agreement_top_k"] == 3 and "phrase_first_token_mass" not in greedy and "phrase_bias" not in greedy
    assert "phrase_agreement_top_k" not in sampled and sampled["phrase_first_token_mass"] is True
    assert sampled["phrase_bias"] == DECODING_DEFAULTS["sampling"]["phrase_bias"] != 0
    explicit = PipelineConfig(grounded=False, do_sample=True, agreement_top_k=3, first_token_mass=False, phrase_bias=0.0)
    assert explicit.decoding_settings() == DECODING_DEFAULTS["greedy"]
    assert {k: v for k, v in explicit.generation_kwargs().items() if k.startswith("phrase_")} == {
        k: v for k, v in greedy.items() if k.startswith("phrase_")}


@pytest.mark.parametrize("verified", [False, True])
def test_the_context_gate_holds_phrases_to_the_tokens_they_follow_in_the_documents(pipeline, verified):
    pipeline.model.scorer = PreferPhrases()
    prompt = "New York City is the most populous city in the"  # the document goes on " United States"
    verify_top_k = pipeline.model.vocab_size if verified else 0
    settings = {"top_k": 1, "max_new_tokens": 4, "agreement_top_k": 0, "verify_top_k": verify_top_k}
    pipeline.config = PipelineConfig(grounded=False, **settings)
    free = pipeline(prompt)
    pipeline.config = PipelineConfig(grounded=False, **settings, context_tokens=2)
    gated = pipeline(prompt)
    assert free.phrase_steps == free.steps  # ungated, a phrase wins every step
    assert gated.segments[0].is_phrase and gated.segments[0].text == " United States"
    assert gated.phrase_steps < gated.steps  # after " United States" the text leaves the document
    contexts = pipeline.phrase_contexts([DOCS[0]], pipeline.candidates([DOCS[0]]))
    tokens = pipeline.model.tokenizer
    assert contexts[tuple(tokens(" in the", add_special_tokens=False).input_ids)] == {
        tuple(tokens(" United States", add_special_tokens=False).input_ids)}
    assert pipeline.batch([prompt, prompt])[1].text == gated.text


@pytest.mark.parametrize("verified", [False, True])
def test_the_state_gate_opens_a_rows_phrases_by_its_own_documents_keys(pipeline, verified):
    pipeline.model.scorer = PreferPhrases()
    prompts = ["Which river flows through New York City?", "Tell me about France. Paris"]
    verify_top_k = pipeline.model.vocab_size if verified else 0
    settings = {"top_k": 1, "max_new_tokens": 4, "agreement_top_k": 0, "verify_top_k": verify_top_k}
    pipeline.config = PipelineConfig(grounded=False, **settings, state_threshold=1.0)  # no state is that close: the bare LM
    shut = pipeline.batch(prompts)
    assert [r.phrase_steps for r in shut] == [0, 0] and isinstance(pipeline.model.scorer, PreferPhrases)
    bare = pipeline.model.lm.generate(**pipeline.model.tokenizer(prompts[:1], return_tensors="pt"), max_new_tokens=4,
                                      do_sample=False, no_repeat_ngram_size=4)
    assert shut[0].text == pipeline.model.tokenizer.decode(bare[0, -4:])
    pipeline.config = PipelineConfig(grounded=False, **settings, state_threshold=-1.0)  # every phrase with a key in its documents
    opened = pipeline.batch(prompts)
    for result in opened:
        assert result.phrase_steps == result.steps
        assert {s.source for s in result.segments if s.is_phrase} == {result.documents[0]["id"]}
    read = _DOCUMENT_STATES[pipeline.model.lm].misses
    again = PhrasePipeline(pipeline.model, pipeline.index, pipeline.config).batch(prompts)
    assert [r.text for r in again] == [r.text for r in opened]
    assert _DOCUMENT_STATES[pipeline.model.lm].misses == read  # another pipeline on the LM reads no document again
    documents = pipeline.index.search_documents(prompts, k=1)
    phrases = [pipeline.candidates(found) for found in documents]
    pipeline.model.set_phrases(phrases, mid_sentence_forms=False)
    keys = pipeline.state_keys(documents, phrases)
    table = pipeline.model.phrase_table
    for row, found in enumerate(phrases):
        mine = {table.token_ids.index(tokens) for tokens in table.tokenize([p.text for p in found])}
        assert set(keys.phrases[keys.rows == row].tolist()) <= mine and keys.num_rows == 2
    for bad, message in ((1.5, "is a cosine"), (-2.0, "is a cosine")):
        with pytest.raises(ValueError, match=message):
            PipelineConfig(grounded=False, state_threshold=bad)
    with pytest.raises(ValueError, match="real-time mode adds phrases while it decodes"):
        PipelineConfig(grounded=False, state_threshold=0.9, realtime=True)


@pytest.mark.parametrize("verified", [False, True])
def test_the_phrase_bias_reaches_plain_and_verified_decoding(pipeline, verified):
    prompt = "Which river flows through New York City?"
    pipeline.model.scorer = PreferPhrases()
    verify_top_k = pipeline.model.vocab_size if verified else 0  # verification that keeps every phrase whole
    settings = {"top_k": 1, "max_new_tokens": 3, "agreement_top_k": 0, "verify_top_k": verify_top_k}
    pipeline.config = PipelineConfig(grounded=False, **settings)
    assert pipeline(prompt).phrase_steps >= 1
    pipeline.config = PipelineConfig(grounded=False, **settings, phrase_bias=-2e4)
    assert pipeline(prompt).phrase_steps == 0


@pytest.mark.parametrize(("call", "error", "fragment"), [
    (lambda p: p(""), ValueError, "prompt 0 is empty"),
    (lambda p: p("   \n"), ValueError, "prompt 0 is empty"),
    (lambda p: p.batch(["The river", ""]), ValueError, "prompt 1 is empty"),
    (lambda p: p.batch("The river"), TypeError, "pass [prompt]"),
    (lambda p: p(None), TypeError, "prompt 0 is NoneType"),
], ids=["empty", "whitespace", "empty in a batch", "a bare string as batch", "None"])
def test_a_prompt_without_text_is_refused_at_the_door(pipeline, call, error, fragment):
    with pytest.raises(error, match=None) as raised:
        call(pipeline)
    assert fragment in str(raised.value)


def test_phrases_with_special_tokens_are_left_out_of_the_candidates(pipeline):
    documents = [{"id": "odd", "text": "The river runs <|endoftext|> past the old mill and the old mill stands."}]
    assert all("<|endoftext|>" not in p.text for p in pipeline.candidates(documents))


def test_a_requests_phrases_are_tokenized_once(pipeline, monkeypatch):
    """The candidates' length check, the context gate and set_phrases share the table's remembered token ids."""
    from tests.helpers import count_tokenized

    pipeline.config = PipelineConfig(grounded=False, top_k=1, max_new_tokens=2, agreement_top_k=0, context_tokens=2)
    asked = count_tokenized(pipeline.model.tokenizer, monkeypatch)
    result = pipeline("The Hudson River flows")
    phrases = [p.text for p in pipeline.model.phrases]
    assert result.num_phrases and phrases
    assert all(asked.count(text) == 1 for text in phrases)


def test_grounded_decoding_at_gamma_one_is_the_lm_reading_the_documents(pipeline, llama):
    import torch

    from retrieval.reading import in_context_ids

    pipeline.config = PipelineConfig(top_k=2, read_documents=1, max_new_tokens=10, no_repeat_ngram_size=0, gamma=1.0)
    prompts = ["Which river flows through New York City?", "What is the capital of France?"]
    results = pipeline.batch(prompts)
    tokenizer = pipeline.model.tokenizer
    for prompt, result in zip(prompts, results):
        context = in_context_ids(tokenizer, result.documents[:1], 384)
        ids = torch.tensor([context + tokenizer(prompt, add_special_tokens=False).input_ids])
        bare = llama.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
        assert result.text == tokenizer.decode(bare[0, ids.shape[1] :])[: len(result.text)] and result.text
        assert result.steps <= 10


def test_corpus_fills_keep_the_grounded_text_and_are_built_once_per_index(pipeline, monkeypatch):
    import retrieval.pipeline
    from dynvocab.decoding import CorpusDrafts
    from retrieval.corpus_drafts import corpus_drafts

    prompts = ["Which river flows through New York City?", "What is the capital of France?"]
    settings = {"top_k": 2, "read_documents": 1, "max_new_tokens": 10, "no_repeat_ngram_size": 0}
    tokenizer = pipeline.model.tokenizer
    for gamma in (1.0, 0.05):
        pipeline.config = PipelineConfig(**settings, gamma=gamma, fill_tokens=0)
        plain = pipeline.batch(prompts)
        # a corpus that holds what the LM writes: the fills propose it, where the documents have nothing
        written = CorpusDrafts(tokenizer([p + r.text for p, r in zip(prompts, plain)], add_special_tokens=False).input_ids)
        monkeypatch.setattr(retrieval.pipeline, "corpus_drafts", lambda index, tokenizer: written)
        pipeline.config = PipelineConfig(**settings, gamma=gamma, fill_tokens=4)
        filled = pipeline.batch(prompts)
        monkeypatch.undo()
        for one, other in zip(plain, filled):  # as many steps, so the filled text runs further
            assert other.text.startswith(one.text) and other.steps <= one.steps
        assert sum(r.copied_tokens for r in filled) > sum(r.copied_tokens for r in plain)
    assert PipelineConfig(**settings).fill_tokens == 4 and PipelineConfig(**settings, draft_tokens=0).fill_tokens == 0
    corpus = corpus_drafts(pipeline.index, pipeline.model.tokenizer)
    assert len(corpus) > 0 and corpus_drafts(pipeline.index, pipeline.model.tokenizer) is corpus
    with pytest.raises(ValueError, match="fill_tokens=4 fills the grounded steps"):
        PipelineConfig(grounded=False, fill_tokens=4)


def test_stored_document_keys_and_values_give_the_lm_reading_the_documents_and_are_read_once(pipeline, llama):
    import torch

    from retrieval.pipeline import _DOCUMENT_KV
    from retrieval.reading import document_context_ids

    pipeline.config = PipelineConfig(top_k=2, read_documents=2, max_new_tokens=10, no_repeat_ngram_size=0, gamma=1.0,
                                     document_kv=2)
    prompt, tokenizer = "Which river flows through New York City?", pipeline.model.tokenizer
    result = pipeline(prompt)
    first, second = document_context_ids(tokenizer, result.documents[:2], 384)
    kv = _DOCUMENT_KV[llama]
    read = kv.misses
    assert read == 2 and pipeline(prompt).text == result.text and kv.misses == read  # the second request read none
    # the LM reading the first document whole, then the second as read alone and placed after it
    cache = kv.cache([first, second])
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
    bare = llama.generate(torch.cat([torch.tensor([first + second]), ids], 1), past_key_values=cache,
                          max_new_tokens=40, do_sample=False)
    assert result.text and result.text == tokenizer.decode(bare[0, len(first) + len(second) + ids.shape[1] :])[: len(result.text)]


def test_the_first_documents_stored_keys_and_values_give_exactly_the_lm_reading_the_documents(pipeline):
    from retrieval.pipeline import _DOCUMENT_KV

    prompts = ["Which river flows through New York City?", "What is the capital of France?"]
    settings = {"top_k": 2, "read_documents": 2, "max_new_tokens": 10, "no_repeat_ngram_size": 0, "gamma": 1.0}
    pipeline.config = PipelineConfig(**settings)
    read = [result.text for result in pipeline.batch(prompts)]
    pipeline.config = PipelineConfig(**settings, document_kv=1)
    assert [result.text for result in pipeline.batch(prompts)] == read
    assert _DOCUMENT_KV[pipeline.model.lm].misses == 2  # each prompt's first document read once, and kept
    assert [result.text for result in pipeline.batch(prompts)] == read and _DOCUMENT_KV[pipeline.model.lm].hits == 2


def test_stored_keys_and_values_need_grounded_decoding_and_a_rotary_lm(tokenizer):
    from dynvocab.states.kv import DocumentKV
    from tests.helpers import tiny_gpt2

    with pytest.raises(ValueError, match="only grounded decoding does: pass grounded=True and at most"):
        PipelineConfig(grounded=False, document_kv=1)
    with pytest.raises(ValueError, match="at most read_documents=2"):
        PipelineConfig(document_kv=3)
    with pytest.raises(ValueError, match="rotary position embedding.*document_kv=0"):
        DocumentKV(tiny_gpt2(len(tokenizer)))


def test_grounded_decoding_cites_what_it_copies_at_its_offsets(pipeline):
    pipeline.config = PipelineConfig(top_k=1, max_new_tokens=8, no_repeat_ngram_size=0, gamma=1e-6,
                                     draft_step_cost=0.0)  # every draft the documents offer is kept
    result = pipeline("New York City is the most populous city")
    assert result.copied_tokens > 0 and result.citations and result.cited_share > 0.3
    for c in result.citations:
        assert result.text[c.start : c.end] == c.text
        source = result.documents[c.document]["text"]
        assert source[c.document_start : c.document_start + len(c.text)] == c.text
    assert "^1" in result.marked() and result.to_dict()["cited_share"] == result.cited_share
    assert result.grounded and result.sources() == [
        f"^1 New York (characters {', '.join(str(c.document_start) for c in result.citations)})"]


def test_grounded_settings_are_checked():
    with pytest.raises(ValueError, match="gamma=0"):
        PipelineConfig(gamma=0.0)
    with pytest.raises(ValueError, match="pass grounded=False for verify_top_k"):
        PipelineConfig(verify_top_k=1)
    with pytest.raises(ValueError, match="relax_after=-1"):
        PipelineConfig(relax_after=-1)
    assert PipelineConfig().draft_tokens == 8 and PipelineConfig(grounded=False).draft_tokens == 0


@pytest.mark.parametrize(("settings", "timed"), [
    ({"gamma": 1.0}, True),
    ({"grounded": False, "verify_top_k": 1, "draft_tokens": 8}, True),
    ({}, False),  # relaxed (gamma 0.05): a kept draft changes the text
    ({"gamma": 1.0, "do_sample": True}, False),  # sampled: drafts change what the draws see
    ({"grounded": False, "verify_top_k": 3, "draft_tokens": 8}, False),
])
def test_the_drafts_step_cost_is_timed_only_where_drafts_cannot_change_the_text(pipeline, monkeypatch, settings, timed):
    def timing(model, draft_tokens):
        calls.append(draft_tokens)
        return 0.05
    calls = []
    monkeypatch.setattr(reading, "draft_step_cost", timing)
    _DRAFT_STEP_COSTS.pop(pipeline.model, None)
    pipeline.config = PipelineConfig(max_new_tokens=8, **settings)
    step_cost = pipeline.drafter([DOCS[0]]).step_cost
    assert (step_cost, calls) == ((0.05, [8]) if timed else (FIXED_DRAFT_STEP_COST, []))
    pipeline.config = PipelineConfig(max_new_tokens=8, **settings, draft_step_cost=0.0)  # an explicit cost is kept
    assert pipeline.drafter([DOCS[0]]).step_cost == 0.0


def test_no_phrases_wanted_means_no_phrases_cut(pipeline, monkeypatch):
    def extract(*args, **kwargs):
        raise AssertionError("phrases were cut for a request that plugs in none")
    monkeypatch.setattr(reading, "extract_phrases", extract)
    pipeline.config = PipelineConfig(max_phrases=0, max_new_tokens=4)
    assert pipeline.candidates(DOCS) == []
    assert pipeline("Which river flows through New York City?").text


def test_the_context_cut_at_each_document_joins_back_to_what_the_lm_reads(tokenizer):
    from retrieval.reading import document_context_ids, in_context_ids

    parts = document_context_ids(tokenizer, DOCS, 8)
    assert len(parts) == len(DOCS) and [t for part in parts for t in part] == in_context_ids(tokenizer, DOCS, 8)
    for part, document in zip(parts, DOCS):
        cut = tokenizer.decode(tokenizer(document["text"], add_special_tokens=False).input_ids[:8])
        assert tokenizer.decode(part, skip_special_tokens=True).strip() == cut.strip()  # its document, a blank line
    assert document_context_ids(tokenizer, DOCS[:1], 8) == [in_context_ids(tokenizer, DOCS[:1], 8)]
    assert document_context_ids(tokenizer, [], 8) == [] == document_context_ids(tokenizer, DOCS, 0)


def test_a_slow_tokenizer_is_told_to_load_the_fast_one_to_read_documents_in_parts(tokenizer):
    from unittest import mock

    from retrieval.reading import document_context_ids

    with mock.patch.object(type(tokenizer), "is_fast", new_callable=mock.PropertyMock, return_value=False):
        with pytest.raises(ValueError, match="slow tokenizer.*use_fast=True"):
            document_context_ids(tokenizer, DOCS, 8)
