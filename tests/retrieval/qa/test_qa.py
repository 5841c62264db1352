"""Citation-aware QA on a tiny random Llama: markers from provenance, the numbered prompt, batched systems."""

import pytest

from dynvocab import DynamicVocabLM, Phrase, Segment
from retrieval.qa.citations import MARKER, cite_copies, cite_segments, numbered_phrases, strip_markers
from retrieval.qa import answering
from retrieval.qa.answering import (
    CitationQA, QAConfig, build_messages, cited_phrase_contexts, document_phrases, prompt_ids,
)
from tests.helpers import PreferPhrases

DOCS = [
    {"id": "nyc", "title": "New York", "text": "New York City is the most populous city in the United States. "
                                               "It lies on the Hudson River."},
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France. The Seine river flows through Paris."},
]
QUESTION = "Which river flows through New York City?"


@pytest.fixture
def model(llama, tokenizer):
    return DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()


def quick(**settings) -> QAConfig:
    defaults = {"max_new_tokens": 6, "stop_at_newline": False, "max_sentences": 0, "agreement_top_k": 0, "context_tokens": 0,
                "grounded": False}  # the paper's mode; grounded answers have tests of their own below
    return QAConfig(**defaults | settings)


# ---------------------------------------------------------------- markers from provenance (no model)
def test_a_phrase_without_marker_gets_its_document_number_after_it():
    segments = [Segment("The river is", False), Segment(" the Hudson River", True, "1"), Segment(".", False)]
    answer, citations = cite_segments(segments, num_documents=2)
    assert answer == "The river is the Hudson River[1]."
    assert [(c.number, c.span, c.origin) for c in citations] == [(1, "the Hudson River", "phrase")]
    assert answer[citations[0].start :].startswith("[1]")


def test_a_phrase_carrying_its_marker_is_not_marked_twice():
    segments = [Segment(" the Hudson River[2]", True, "2"), Segment("[2] and", False), Segment(" Paris[1]", True, "1")]
    answer, citations = cite_segments(segments, num_documents=2)
    assert answer == " the Hudson River[2] and Paris[1]"
    assert [(c.number, c.span, c.origin) for c in citations] == [(2, "the Hudson River", "phrase"), (1, "Paris", "phrase")]


def test_model_written_markers_are_kept_with_the_span_before_them_and_bad_numbers_dropped():
    segments = [Segment("It is old. The Seine flows[2] there[7][0].", False)]
    answer, citations = cite_segments(segments, num_documents=3)
    assert answer == "It is old. The Seine flows[2] there."
    assert [(c.number, c.span, c.origin) for c in citations] == [(2, "The Seine flows", "model")]


def test_numbered_phrases_carry_their_document_number_and_marker():
    rows = [[Phrase(" New York"), Phrase(" Hudson River")], [Phrase(" New York"), Phrase(" the Seine")]]
    marked = numbered_phrases(rows, markers=True)
    assert [(p.text, p.source) for p in marked] == [
        (" New York[1]", "1"), (" Hudson River[1]", "1"), (" New York[2]", "2"), (" the Seine[2]", "2")]
    plain = numbered_phrases(rows, markers=False)
    assert [(p.text, p.source) for p in plain] == [(" New York", "1"), (" Hudson River", "1"), (" the Seine", "2")]
    assert strip_markers("The Seine[2] flows [1].") == "The Seine flows."


def test_document_phrases_fit_the_table_with_their_marker(tokenizer):
    for markers in (True, False):
        phrases = document_phrases(DOCS, tokenizer, QAConfig(markers=markers), max_tokens=8)
        assert phrases and {p.source for p in phrases} == {"1", "2"}
        for phrase in phrases:
            body = MARKER.sub("", phrase.text)
            assert body in DOCS[int(phrase.source) - 1]["text"]  # cut verbatim from its document
            assert len(tokenizer(body + "[1]", add_special_tokens=False)["input_ids"]) <= 8
            assert phrase.text.endswith(f"[{phrase.source}]") == markers
    content = document_phrases(DOCS, tokenizer, QAConfig(phrases="content"), max_tokens=8)
    assert not any(MARKER.sub("", p.text).split()[-1].lower() in ("the", "of", "is") for p in content)
    assert document_phrases(DOCS, tokenizer, QAConfig(phrases="none"), max_tokens=8) == []


# ---------------------------------------------------------------- the prompt
def test_the_prompt_numbers_the_documents_after_a_worked_example(tokenizer):
    messages = build_messages(QUESTION, DOCS)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "Document [1](Title: New York): New York City" in messages[-1]["content"]
    assert "Document [2](Title: Paris)" in messages[-1]["content"] and "[1]" in messages[2]["content"]
    plain = tokenizer.decode(prompt_ids(tokenizer, QUESTION, DOCS, QAConfig()))  # GPT-2 has no chat template
    assert plain.endswith("Answer:") and plain.count("Question:") == 2
    assert len(build_messages(QUESTION, DOCS, one_shot=False)) == 2


def test_a_chat_template_is_used_when_the_tokenizer_has_one(tokenizer):
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    text = tokenizer.decode(prompt_ids(tokenizer, QUESTION, DOCS, QAConfig()))
    assert text.startswith("<system>Answer the question") and text.endswith("<assistant>")
    assert "Answer:" not in tokenizer.decode(prompt_ids(tokenizer, QUESTION, DOCS, QAConfig()))
    assert tokenizer.decode(prompt_ids(tokenizer, QUESTION, DOCS, QAConfig(chat_template="never"))).endswith("Answer:")


# ---------------------------------------------------------------- answering
def test_emitted_phrases_cite_their_documents_exactly(model):
    model.scorer = PreferPhrases()
    for markers in (True, False):
        result = CitationQA(model, config=quick(markers=markers))(QUESTION, DOCS)
        assert result.phrase_steps == result.steps == 6
        phrase_citations = [c for c in result.citations if c.origin == "phrase"]
        assert len(phrase_citations) == 6 and result.cited
        for citation in phrase_citations:
            assert citation.span in DOCS[citation.number - 1]["text"]
            assert result.answer[citation.start :].startswith(f"[{citation.number}]")
        assert [d["id"] for d in result.documents] == ["nyc", "paris"]


def test_the_bare_system_is_the_lm_alone(model, llama, tokenizer):
    bare = CitationQA(model, config=quick(phrases="none", max_new_tokens=5))(QUESTION, DOCS)
    ids = prompt_ids(tokenizer, QUESTION, DOCS, QAConfig())
    import torch

    expected = llama.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)[0, len(ids) :]
    assert bare.text == tokenizer.decode(expected, skip_special_tokens=True).strip()
    assert bare.num_phrases == 0 and bare.phrase_steps == 0


@pytest.mark.parametrize("markers", [True, False])
def test_the_context_gate_keys_each_body_to_its_own_document_and_marker(tokenizer, markers):
    phrases = document_phrases(DOCS, tokenizer, QAConfig(markers=markers), 16)
    contexts = cited_phrase_contexts(DOCS, phrases, tokenizer, 2, markers)
    ids = lambda text: tuple(tokenizer(text, add_special_tokens=False).input_ids)  # noqa: E731
    # " the United States" follows " populous city in" in document 1 only, " the capital of France" " Paris is" in 2
    assert ids(" the United States" + ("[1]" if markers else "")) in contexts[ids(" city in")]
    assert ids(" the capital" + ("[2]" if markers else "")) in contexts[ids("Paris is")]
    if markers:  # a context of document 2 lets only document 2's phrases through
        assert {tokenizer.decode(found)[-3:] for found in contexts[ids("Paris is")]} == {"[2]"}


def test_a_gated_system_writes_a_phrase_only_after_its_body_context(model):
    model.scorer = PreferPhrases()
    free = CitationQA(model, config=quick())(QUESTION, DOCS)
    gated = CitationQA(model, config=quick(context_tokens=2))(QUESTION, DOCS)
    assert free.phrase_steps == free.steps and gated.phrase_steps < gated.steps
    assert CitationQA(model).answer_many(QUESTION, [quick(), quick(context_tokens=2)], DOCS)[1].answer == gated.answer


def test_a_phrase_bias_shifts_the_balance_and_is_never_mixed_into_one_batch(model):
    model.scorer = PreferPhrases()  # phrases outscore tokens by 100
    assert CitationQA(model, config=quick())(QUESTION, DOCS).phrase_steps == 6
    held_back = CitationQA(model, config=quick(phrase_bias=-2e4))(QUESTION, DOCS)
    assert held_back.phrase_steps == 0 and held_back.num_phrases
    with pytest.raises(ValueError, match="must agree on phrase_bias"):
        CitationQA(model).answer_many(QUESTION, [quick(), quick(phrase_bias=-2e4)], DOCS)


def test_systems_answered_together_equal_each_answered_alone(model):
    model.scorer = PreferPhrases()
    configs = [quick(phrases="none"), quick(phrases="ngram"), quick(phrases="ngram", markers=False), quick(phrases="content")]
    together = CitationQA(model).answer_many(QUESTION, configs, DOCS)
    alone = [CitationQA(model, config=c)(QUESTION, DOCS) for c in configs]
    assert [r.answer for r in together] == [r.answer for r in alone]
    assert together[0].num_phrases == 0 and all(r.num_phrases for r in together[1:])


def test_a_state_gated_system_holds_back_phrases_where_the_lms_state_meets_no_key(model, tokenizer, monkeypatch):
    """Each phrase competes only where the LM's state is close to its state before the phrase in the prompt's
    documents (not in its instructions or worked example); systems gated alike answer together as alone."""
    model.scorer = PreferPhrases()
    free = CitationQA(model, config=quick(markers=False, max_new_tokens=10))(QUESTION, DOCS)
    configs = [quick(phrases=mode, markers=False, max_new_tokens=10, state_threshold=0.6)
               for mode in ("ngram", "content")]
    alone = [CitationQA(model, config=c)(QUESTION, DOCS) for c in configs]
    assert free.phrase_steps == free.steps and 0 < alone[0].phrase_steps < free.phrase_steps
    together = CitationQA(model).answer_many(QUESTION, configs, DOCS)
    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.phrase_steps for r in together] == [r.phrase_steps for r in alone]
    keyed, row_state_keys = [], answering.row_state_keys
    monkeypatch.setattr(answering, "row_state_keys", lambda *a, **k: keyed.append((a, k)) or row_state_keys(*a, **k))
    CitationQA(model, config=configs[0])(QUESTION, DOCS)
    (_, _, [[ids]], _, threshold), kwargs = keyed[0]
    start = kwargs["first_key"][0][0]
    assert threshold == 0.6 and ids == prompt_ids(tokenizer, QUESTION, DOCS, configs[0])
    assert tokenizer.decode(ids[start:]).lstrip().startswith("Document [1](Title: New York)")  # the documents on


def test_an_answer_guarded_against_its_own_ngrams_may_still_copy_the_documents(model):
    """Phrases are cut from the documents the prompt shows: the prompt-wide n-gram rule bans those whose tokens the prompt
    holds as they are, the answer-only one lets them be written."""
    model.scorer = PreferPhrases()
    guard = {"no_repeat_ngram_size": 2, "markers": False}
    everything = CitationQA(model, config=quick(no_repeat_ngram_scope="all", **guard))(QUESTION, DOCS)
    answer = CitationQA(model, config=quick(no_repeat_ngram_scope="new", **guard))(QUESTION, DOCS)
    assert answer.phrase_steps == 6 and everything.phrase_steps < 3


def make_the_lm_write(model, tokenizer, text: str) -> list[int]:
    """Makes the LM answer ``text`` (a span of a document), then end: each step its next token after the tokens the
    answer spells so far, whatever phrases were kept. Returns those tokens, the end of text last."""
    from transformers import LogitsProcessor, LogitsProcessorList

    copied = tokenizer(text, add_special_tokens=False).input_ids + [model.generation_config.eos_token_id]
    start, table, vocab = len(prompt_ids(tokenizer, QUESTION, DOCS, QAConfig())), model.phrase_table, model.vocab_size

    class WriteText(LogitsProcessor):
        def __call__(self, input_ids, scores):
            for row, ids in enumerate(input_ids.tolist()):
                spelled = sum(len(table.token_ids[i - vocab]) if i >= vocab else 1 for i in ids[start:])
                scores[row, :vocab] = -1e9
                scores[row, copied[min(spelled, len(copied) - 1)]] = 0
            return scores

    processors = model.phrase_logits_processors
    model.phrase_logits_processors = lambda **kwargs: LogitsProcessorList([WriteText(), *processors(**kwargs)])
    return copied


def test_a_verified_answer_is_the_lms_own_and_its_copied_spans_cite_their_document(model, tokenizer):
    """``verify_top_k=1`` keeps a phrase only where the LM writes its tokens itself: the answer is the bare LM's, and
    each span of it that a kept phrase wrote cites the document the phrase was cut from."""
    copied = make_the_lm_write(model, tokenizer, " New York City is the most populous city")
    model.scorer = PreferPhrases()  # every phrase the rules let through outscores the tokens
    settings = {"markers": False, "max_new_tokens": len(copied)}
    bare = CitationQA(model, config=quick(phrases="none", **settings))(QUESTION, DOCS)
    verified = CitationQA(model, config=quick(verify_top_k=1, **settings))(QUESTION, DOCS)
    unverified = CitationQA(model, config=quick(agreement_top_k=1, **settings))(QUESTION, DOCS)
    assert bare.text == tokenizer.decode(copied[:-1]).strip() and not bare.citations
    assert verified.text == bare.text and unverified.text != bare.text  # phrases win alike; only verified ones fit
    phrase_citations = [c for c in verified.citations if c.origin == "phrase"]
    assert phrase_citations and verified.steps < bare.steps
    assert all(c.number == 1 and c.span in DOCS[0]["text"] for c in phrase_citations)
    assert strip_markers(verified.answer) == bare.answer
    # the state gate in verified decoding: the row's keys are applied, and the answer stays the LM's own
    gates, state_gate = [], model.state_gate
    model.state_gate = lambda keys: gates.append(keys) or state_gate(keys)
    gated = CitationQA(model, config=quick(verify_top_k=1, state_threshold=0.9, **settings))(QUESTION, DOCS)
    assert gated.text == bare.text and {c.number for c in gated.citations if c.origin == "phrase"} <= {1}
    assert [k.keys.shape[0] > 0 for k in gates if k is not None] == [True]  # the row's keys, once


def test_a_span_copied_from_a_document_is_followed_by_its_marker_once(tokenizer):
    answer, citations = cite_segments([Segment("It lies on the Hudson River and in Paris[2].", False)], 2)
    marked, moved = cite_copies(answer, citations, DOCS, tokenizer, min_tokens=4)
    assert marked == "It lies on the Hudson River[1] and in Paris[2]."
    assert [(c.number, c.origin, marked[c.start : c.start + 3]) for c in moved] == [(1, "copy", "[1]"), (2, "model", "[2]")]
    assert moved[0].span == "It lies on the Hudson River"
    again, same = cite_copies(marked, moved, DOCS, tokenizer, min_tokens=4)  # the marker stands there already
    assert again == marked and same == moved
    assert cite_copies("It lies near a river.", [], DOCS, tokenizer, min_tokens=4) == ("It lies near a river.", [])
    # a copy that stops inside a word is cited up to the word before: never "the 17[1]th"
    inside, cut = cite_copies("It lies on the Hudson Riverside.", [], DOCS, tokenizer, min_tokens=4)
    assert inside == "It lies on the Hudson[1] Riverside." and cut[0].span == "It lies on the Hudson"


def test_a_grounded_answer_at_gamma_one_is_the_lms_own_in_fewer_steps_and_its_copies_cite(model, tokenizer):
    """Grounded: the LM writes every token, so at gamma = 1 the answer is its own whatever the phrases propose; the
    drafts copy from the documents in fewer LM calls, and each copied span cites its document."""
    copied = make_the_lm_write(model, tokenizer, " It lies on the Hudson River.")
    model.scorer = PreferPhrases()  # the phrase head proposes its phrases everywhere
    settings = {"markers": False, "max_new_tokens": len(copied)}
    bare = CitationQA(model, config=quick(phrases="none", **settings))(QUESTION, DOCS)
    grounded = CitationQA(model, config=quick(grounded=True, gamma=1.0, **settings))(QUESTION, DOCS)
    assert bare.text == tokenizer.decode(copied[:-1]).strip() and not bare.citations
    assert grounded.text == bare.text and grounded.steps < bare.steps
    assert [(c.number, c.origin, c.span) for c in grounded.citations] == [(1, "copy", "It lies on the Hudson River.")]
    assert grounded.answer == "It lies on the Hudson River.[1]" and strip_markers(grounded.answer) == bare.answer


def test_retrieved_documents_and_the_prefix_cache(model, tokenizer):
    from retrieval import DocumentIndex
    from tests.helpers import HashEncoder

    index = DocumentIndex.build(DOCS + [{"id": "tokyo", "title": "Tokyo", "text": "Tokyo is the capital of Japan."}],
                                HashEncoder(), index_type="flat")
    qa = CitationQA(model, index)
    results = qa.answer_many(QUESTION, [quick(top_k=1), quick(top_k=3, phrases="none")])
    assert [len(r.documents) for r in results] == [1, 3]
    fresh = CitationQA(model, index).answer_many(QUESTION, [quick(top_k=3, phrases="none")])
    assert fresh[0].answer == results[1].answer  # a prompt prefilled from a cached prefix decodes the same


def test_the_answer_ends_at_its_first_line_break(model, tokenizer):
    from transformers import LogitsProcessor

    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    start = len(prompt_ids(tokenizer, QUESTION, DOCS, QAConfig()))

    class Script(LogitsProcessor):
        """Writes two word tokens, then a line break, then more words."""

        def __call__(self, input_ids, scores):
            step = input_ids.shape[1] - start
            scores[:] = -1e9
            scores[:, newline if step == 2 else 1000 + step] = 0
            return scores

    generate = model.generate
    model.generate = lambda *args, **kwargs: generate(*args, logits_processor=[Script()], **kwargs)
    config = QAConfig(max_new_tokens=8, phrases="none", agreement_top_k=0, grounded=False)
    result = CitationQA(model, config=config)(QUESTION, DOCS)
    assert result.steps == 3 and result.answer == tokenizer.decode([1000, 1001]).strip()


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [({"top_k": 0}, "top_k=0"), ({"phrases": "parsed"}, "phrases='parsed'"), ({"document_words": 0}, "document_words"),
     ({"chat_template": "always"}, "chat_template"), ({"max_phrases": -1}, "max_phrases"),
     ({"no_repeat_ngram_scope": "answer"}, "no_repeat_ngram_scope='answer'"), ({"verify_top_k": -1}, "verify_top_k"),
     ({"state_threshold": 0.9}, "pass markers=False"), ({"state_threshold": 2.0, "markers": False}, "is a cosine"),
     ({"verify_top_k": 1}, "pass grounded=False for verify_top_k=1"), ({"gamma": 0.0}, r"gamma=0.0 must be in \(0, 1\]"),
     ({"draft_tokens": 0}, "draft_tokens")],
)
def test_bad_settings_are_refused(settings, fragment):
    with pytest.raises(ValueError, match=fragment):
        QAConfig(**settings)


def test_bad_calls_are_refused(model, llama):
    qa = CitationQA(model)
    with pytest.raises(ValueError, match="no index"):
        qa(QUESTION)
    with pytest.raises(ValueError, match="non-empty"):
        qa("  ", DOCS)
    with pytest.raises(ValueError, match="documents is empty"):
        qa(QUESTION, [])
    with pytest.raises(TypeError, match="'text'"):
        qa(QUESTION, [{"title": "no text"}])
    with pytest.raises(ValueError, match="must agree on max_new_tokens"):
        qa.answer_many(QUESTION, [quick(), quick(max_new_tokens=3)], DOCS)
    with pytest.raises(TypeError, match="DynamicVocabLM"):
        CitationQA(llama)


def test_where_an_answer_ends():
    from retrieval.qa.answering import answer_end

    assert answer_end("The Seine[1]. It is long.", sentences=1) == len("The Seine[1].")
    assert answer_end("The Seine.", sentences=1) == len("The Seine.")  # not over yet: nothing follows the period
    assert answer_end("J. Smith wrote it. Then", sentences=1) == len("J. Smith wrote it.")
    assert answer_end("The Seine\nmore", sentences=0) == len("The Seine")
    assert answer_end("The Seine\nmore", newline=False) == len("The Seine\nmore")
    assert answer_end("One. Two. Three", newline=False, sentences=2) == len("One. Two.")
