"""Drafts from documents and the text so far, kept by verified decoding as far as the LM agrees."""

import pytest
import torch
from transformers import LogitsProcessorList, NoRepeatNGramLogitsProcessor

from dynvocab import DynamicVocabLM
from dynvocab.decoding.drafting import CorpusDrafts, DocumentDrafter
from dynvocab.decoding.verification import draft_step_cost, generate_verified


def test_the_follower_of_the_longest_matching_context_is_drafted():
    drafter = DocumentDrafter([[1, 2, 3, 4, 5, 6], [9, 2, 3, 7, 8]], draft_tokens=2, context_tokens=3, min_context=2)
    assert drafter.draft([0, 2, 3]) == [4, 5]  # context (2, 3): the best-ranked document's occurrence
    assert drafter.draft([0, 2, 3, 5, 2, 3]) == [5, 2]  # (2, 3) stood earlier in the text: its follower there first
    assert DocumentDrafter([[1, 2, 3, 4, 5, 6], [9, 2, 3, 7, 8]], 2).draft([9, 2, 3]) == [7, 8]  # the longer context wins
    assert DocumentDrafter([[1, 2, 3]], 4).draft([5, 3]) == []  # no context of two tokens matches
    assert DocumentDrafter([[1, 2, 3]], 4, min_context=1).draft([5, 2]) == [3]
    assert DocumentDrafter([[1, 2, 3, 4]], 8).draft([1, 2]) == [3, 4]  # up to the document's end


def test_every_source_s_draft_is_listed_and_draft_proposes_one_of_them():
    drafter = DocumentDrafter([[1, 2, 3, 4, 5, 6], [9, 2, 3, 7, 8]], draft_tokens=2)
    text = [0, 2, 3, 5, 2, 3]
    assert drafter.proposals(text) == [(("text", 2), [5, 2]), (("documents", 2), [4, 5])]
    assert drafter.draft(text) in [tokens for _, tokens in drafter.proposals(text)]
    assert DocumentDrafter([[1, 2, 3]], 4).proposals([5, 3]) == []


def test_under_a_no_repeat_guard_a_draft_stops_before_a_repeated_ngram_and_gives_way():
    text = [5, 6, 7, 8, 1, 2]
    documents = [[9, 1, 2, 7, 8, 3, 4], [0, 1, 2, 3, 4]]
    assert DocumentDrafter(documents, 4).draft(text) == [7, 8, 3, 4]
    assert DocumentDrafter(documents, 4, no_repeat_ngram_size=2).draft(text) == [7]  # (7, 8) stands in the text
    assert DocumentDrafter(documents, 4, no_repeat_ngram_size=3).draft(text) == [7, 8, 3, 4]
    assert DocumentDrafter([[1, 2, 9, 9, 9]], 4, no_repeat_ngram_size=2).draft(text) == [9, 9]  # nor its own
    loop = [5, 6, 7, 5, 6]  # the text's own follower of (5, 6) would repeat (5, 6, 7); the document's does not
    assert DocumentDrafter([[5, 6, 3]], 4, no_repeat_ngram_size=3).draft(loop) == [3]
    assert DocumentDrafter([[5, 6, 3]], 4).draft(loop) == [7, 5, 6]


def test_proposals_are_judged_against_the_text_and_a_source_that_keeps_too_little_stops_drafting():
    documents = [[1, 2, 9, 3, 4, 9, 5, 6, 9]]
    drafter = DocumentDrafter(documents, 4, step_cost=0.5)
    assert drafter.draft([1, 2]) == [9, 3, 4, 9]  # nothing judged yet: a source counts as keeping one token
    assert drafter.draft([1, 2, 7]) == [] and drafter.kept == {("documents", 2): [1, 0]}  # the text went on with 7
    assert drafter.expected(("documents", 2)) == 0.5
    assert drafter.draft([1, 2, 7, 3, 4]) == []  # 0.5 tokens expected: not worth a call costing 0.5 more
    free = DocumentDrafter(documents, 4)
    assert [free.draft(ids) for ids in ([1, 2], [1, 2, 7], [1, 2, 7, 3, 4])] == [[9, 3, 4, 9], [], [9, 5, 6, 9]]

    followed = DocumentDrafter([list(range(1, 20))], 3, step_cost=0.5)
    text = [1, 2]
    for _ in range(3):
        draft = followed.draft(text)
        assert draft == list(range(text[-1] + 1, text[-1] + 4))  # the text follows the document: drafting goes on
        text = text + draft + [draft[-1] + 1]
    assert followed.kept[("documents", 2)][1] >= 6 and followed.expected(("documents", 2)) > 2


def test_the_drafted_step_cost_is_measured_on_the_model(llama):
    cost = draft_step_cost(llama, 4, context_tokens=8, repeats=2)
    assert isinstance(cost, float) and cost >= 0.0
    with pytest.raises(ValueError, match="draft_tokens=0 must be >= 1"):
        draft_step_cost(llama, 0)


def test_a_drafter_refuses_a_text_it_has_not_seen_grow_and_bad_settings():
    drafter = DocumentDrafter([[1, 2, 3]])
    drafter.draft([1, 2])
    with pytest.raises(ValueError, match="must extend the text of the previous call"):
        drafter.draft([5, 2, 3])
    for bad in ({"draft_tokens": 0}, {"min_context": 0}, {"min_context": 4, "context_tokens": 3},
                {"no_repeat_ngram_size": -1}, {"step_cost": -0.1}):
        with pytest.raises(ValueError, match="draft_tokens=.* must be >= 1"):
            DocumentDrafter([[1, 2, 3]], **bad)


@pytest.fixture
def model(llama, tokenizer):
    return DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()


def _bare(llama, prompt, steps, **kwargs):
    return llama.generate(prompt, max_new_tokens=steps, do_sample=False, **kwargs)[0, prompt.shape[1] :].tolist()


@pytest.mark.parametrize("step_cost", [0.0, 0.6])
def test_drafts_from_a_document_holding_the_lm_text_write_it_in_fewer_steps(model, llama, tokenizer, step_cost):
    prompt = tokenizer("The city of", return_tensors="pt").input_ids
    bare = _bare(llama, prompt, 96)
    document = prompt[0].tolist() + bare[:48]
    drafter = DocumentDrafter([document], 6, step_cost=step_cost)
    out = generate_verified(model, prompt, 12, accept_top_k=1, draft=drafter.draft)
    new = out.sequences[0, prompt.shape[1] :].tolist()
    assert new == bare[: len(new)] and len(new) >= 24 and out.steps == 12  # each step kept several tokens
    unrelated = DocumentDrafter([tokenizer("Quantum zebras dance at noon.").input_ids * 3], 6, min_context=1)
    out = generate_verified(model, prompt, 12, accept_top_k=1, draft=unrelated.draft)
    assert out.sequences[0, prompt.shape[1] :].tolist() == bare[:12]


def test_a_draft_is_judged_with_the_safeguards_so_the_text_is_the_guarded_lm_text(model, llama, tokenizer):
    prompt = tokenizer("In 1990 the", return_tensors="pt").input_ids
    loop = _bare(llama, prompt, 48)  # unguarded, the LM repeats a bigram at its 25th token
    guarded = _bare(llama, prompt, 96, no_repeat_ngram_size=2)
    assert guarded[:24] == loop[:24] and guarded[24] != loop[24]
    guard = LogitsProcessorList([NoRepeatNGramLogitsProcessor(2)])
    drafter = DocumentDrafter([prompt[0].tolist() + loop], 8, min_context=1)  # drafts the repeat
    out = generate_verified(model, prompt, 24, accept_top_k=1, logits_processor=guard, draft=drafter.draft)
    new = out.sequences[0, prompt.shape[1] :].tolist()
    assert new == guarded[: len(new)] and len(new) > 25 and out.cut


def test_nothing_is_kept_after_an_end_of_text(model, llama, tokenizer):
    prompt = tokenizer("The city of", return_tensors="pt").input_ids
    bare = _bare(llama, prompt, 12)
    end = bare[4]  # pretend the LM's fifth token ends the text
    out = generate_verified(model, prompt, 12, accept_top_k=1, eos_token_id=end,
                            draft=DocumentDrafter([prompt[0].tolist() + bare], 8).draft)
    new = out.sequences[0, prompt.shape[1] :].tolist()
    assert new == bare[: bare.index(end) + 1]


def test_a_pipeline_drafts_only_under_verified_decoding():
    from retrieval.config import PipelineConfig

    with pytest.raises(ValueError, match="needs verified decoding: pass grounded=True"):
        PipelineConfig(grounded=False, draft_tokens=8)
    with pytest.raises(ValueError, match="must be >= 0"):
        PipelineConfig(grounded=False, draft_tokens=-1, verify_top_k=1)
    with pytest.raises(ValueError, match="draft_step_cost=-1.0 must be >= 0"):
        PipelineConfig(grounded=False, draft_tokens=8, verify_top_k=1, draft_step_cost=-1.0)
    assert PipelineConfig(grounded=False, draft_tokens=8, verify_top_k=1).draft_tokens == 8


@pytest.mark.parametrize("step_cost", [0.0, 0.6])
def test_drafting_never_changes_what_the_lm_writes_for_random_documents(model, llama, step_cost):
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 500, (1, 6), generator=generator)
    bare = _bare(llama, prompt, 64)
    documents = [torch.randint(0, 500, (40,), generator=generator).tolist() + bare[:5] for _ in range(3)]
    drafter = DocumentDrafter(documents, 4, min_context=1, step_cost=step_cost)
    out = generate_verified(model, prompt, 16, accept_top_k=1, draft=drafter.draft)
    new = out.sequences[0, prompt.shape[1] :].tolist()
    assert new == bare[: len(new)] and len(new) >= 16


def test_drafted_tokens_past_the_stopping_point_are_not_kept(model, llama, tokenizer):
    from transformers import MaxLengthCriteria, StoppingCriteriaList

    prompt = tokenizer("The city of", return_tensors="pt").input_ids
    bare = _bare(llama, prompt, 24)
    stop = StoppingCriteriaList([MaxLengthCriteria(prompt.shape[1] + 5)])
    out = generate_verified(model, prompt, 12, accept_top_k=1, stopping_criteria=stop,
                            draft=DocumentDrafter([prompt[0].tolist() + bare], 8).draft)
    assert out.sequences[0, prompt.shape[1] :].tolist() == bare[:5] and out.steps == 1


def test_the_corpus_drafts_what_most_often_followed_the_longest_context_found():
    corpus = CorpusDrafts([[1, 2, 3, 4], [1, 2, 3, 5], [7, 2, 3, 5], [9, 2, 3, 4, 6]], context_tokens=3, min_context=2)
    assert corpus.follower([1, 2, 3]) == 4  # (1, 2, 3) went on with 4 once and 5 once: the smaller
    assert corpus.follower([7, 2, 3]) == 5  # the longest context decides
    assert corpus.follower([0, 2, 3]) == 4  # (2, 3) alone: 4 twice, 5 twice, so the smaller
    assert corpus.follower([0, 3, 5]) is None and corpus.follower([3]) is None and corpus.follower([8, 99]) is None
    assert corpus.draft([9, 2, 3], 5) == [4, 6] and corpus.draft([9, 2, 3], 1) == [4]  # the chain ends with the corpus
    assert len(corpus) == 4 and len(CorpusDrafts([])) == 0 and CorpusDrafts([]).draft([1, 2], 3) == []
    counted = CorpusDrafts([[1, 2, 8], [1, 2, 9], [5, 1, 2, 9]], context_tokens=2)
    assert counted.follower([1, 2]) == 9  # twice against once
    with pytest.raises(ValueError, match="min_context"):
        CorpusDrafts([[1, 2, 3]], context_tokens=2, min_context=3)
    with pytest.raises(ValueError, match="does not fit one int64 key"):
        CorpusDrafts([[2**30, 1, 2, 3]], context_tokens=3)


def test_the_drafter_says_where_a_source_has_a_follower_without_indexing_the_text():
    drafter = DocumentDrafter([[1, 2, 3, 4]], 4)
    assert drafter.proposes([0, 1, 2]) and not drafter.proposes([0, 5, 6])  # a document's context; none
    assert drafter.proposes([5, 6, 7, 5, 6]) and not drafter.proposes([5, 6, 7, 6, 5])  # the text's own context
    assert drafter.draft([5, 6, 7]) == [] and drafter.proposes([5, 6, 7, 8, 5, 6, 7, 8, 6, 7])  # past what is indexed
    assert drafter.draft([5, 6, 7, 9]) == []  # proposes indexed nothing: the text may still grow its own way
    assert not drafter.proposes([9, 9, 5, 6])  # a text that does not extend this one's is judged alone


def test_the_drafter_fills_from_its_corpus_under_the_ngram_guard():
    corpus = CorpusDrafts([[1, 2, 3, 1, 2, 3, 4]], context_tokens=2, min_context=2)
    assert DocumentDrafter([], 8, corpus=corpus, fill_tokens=3).fill([0, 1, 2]) == [3, 1, 2]
    assert DocumentDrafter([], 8, corpus=corpus, fill_tokens=8, no_repeat_ngram_size=3).fill([0, 1, 2]) == [3, 1, 2]
    assert DocumentDrafter([], 8).fill([0, 1, 2]) == []  # no corpus
    with pytest.raises(ValueError, match="fill_tokens"):
        DocumentDrafter([], 8, corpus=corpus, fill_tokens=0)
