"""Grounded decoding: the LM reads the documents and decides; phrases and drafts only propose; copied spans cite."""

import itertools

import pytest
import torch
from transformers import LogitsProcessorList

from dynvocab import DynamicVocabLM
from dynvocab.decoding.citations import cite, cited_share
from dynvocab.decoding.drafting import CorpusDrafts, DocumentDrafter
from dynvocab.decoding.repetition import PhraseNoRepeatNGram
from dynvocab.decoding.verification import (
    VerifiedBatch,
    VerifiedRow,
    accept_relaxed,
    generate_verified,
    generate_verified_batch,
    grounded_fill,
    grounded_relax,
)
from tests.helpers import PhrasesAlwaysWin, PreferPhrases, TableLM

DOCUMENT = " The river rises in the northern hills and flows south through the old town to the sea."


def _greedy(lm, ids: torch.Tensor, steps: int) -> list[int]:
    out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


def test_gamma_one_writes_the_lm_text_given_the_documents_in_fewer_steps(base_model, tokenizer):
    context = tokenizer(DOCUMENT, return_tensors="pt").input_ids
    prompt = tokenizer(" The city of", return_tensors="pt").input_ids
    reference = _greedy(base_model, torch.cat([context, prompt], 1), 24 * 7)  # a step may keep up to 7 tokens
    # a document that holds the LM's own continuation, and one that leads it astray
    documents = [tokenizer(" zebra crossing").input_ids + reference[4:20], tokenizer(DOCUMENT).input_ids]
    drafter = DocumentDrafter(documents, draft_tokens=6, min_context=1)
    out = generate_verified(base_model, prompt, 24, gamma=1.0, context=context, draft=drafter.draft)
    new = out.sequences[0, prompt.shape[1] :].tolist()
    assert new == reference[: len(new)] and len(new) >= 24
    assert out.steps < len(new) and out.copied_tokens >= len(new) - out.steps  # a step writes one own token at most


def test_a_prefix_already_in_the_cache_is_not_read_again_and_changes_nothing(llama, tokenizer):
    from transformers import DynamicCache

    context = tokenizer(DOCUMENT, return_tensors="pt").input_ids
    prompt = tokenizer(" The river", return_tensors="pt").input_ids
    whole = generate_verified(llama, prompt, 8, gamma=1.0, context=context).sequences
    cache = DynamicCache()
    llama(context[:, :-2], past_key_values=cache, use_cache=True)  # the documents but their last two tokens
    cached = generate_verified(llama, prompt, 8, gamma=1.0, context=context, past_key_values=cache).sequences
    assert cached.tolist() == whole.tolist()
    with pytest.raises(ValueError, match="keep at least its last token out of it"):
        full = DynamicCache()
        llama(torch.cat([context, prompt], dim=1), past_key_values=full, use_cache=True)
        generate_verified(llama, prompt, 8, gamma=1.0, context=context, past_key_values=full)


def test_gamma_one_with_phrases_proposing_is_still_the_lm_text(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.scorer = PhrasesAlwaysWin()  # the phrase head proposes whatever it is given, every step
    context = tokenizer(DOCUMENT, return_tensors="pt").input_ids
    prompt = tokenizer(" The city of", return_tensors="pt").input_ids
    reference = _greedy(llama, torch.cat([context, prompt], 1), 16 * 4)
    model.set_phrases([tokenizer.decode(reference[:1]) + " zebra crossing", tokenizer.decode(reference[4:8])],
                      mid_sentence_forms=False)
    out = generate_verified(model, prompt, 16, gamma=1.0, context=context)
    table, vocab = model.phrase_table, model.vocab_size
    spelled = [t for i in out.sequences[0, prompt.shape[1] :].tolist()
               for t in (table.token_ids[i - vocab] if i >= vocab else (i,))]
    assert spelled == reference[: len(spelled)] and len(spelled) >= 16
    assert out.cut >= 1  # the zebra phrase was proposed and cut after its first token


def test_the_ngram_guard_judges_the_continuation_not_the_documents(llama, tokenizer):
    """Under no_repeat_ngram_size the text is the LM's greedy text given the documents, with the guard over the prompt
    and the continuation only: the documents' wording may be copied, the continuation may not repeat itself."""
    context = tokenizer(DOCUMENT, return_tensors="pt").input_ids
    prompt = tokenizer(" The city of", return_tensors="pt").input_ids
    vocab = llama.config.vocab_size
    full, visible = torch.cat([context, prompt], 1), prompt
    for _ in range(16 * 6):  # the reference: greedy, the guard seeing the prompt and what follows
        scores = LogitsProcessorList([PhraseNoRepeatNGram(2, vocab, [])])(visible, llama(full).logits[:, -1])
        token = scores.argmax(-1, keepdim=True)
        full, visible = torch.cat([full, token], 1), torch.cat([visible, token], 1)
    reference = visible[0, prompt.shape[1] :].tolist()
    drafter = DocumentDrafter([reference[2:12], context[0].tolist()], draft_tokens=5, min_context=1)
    guard = LogitsProcessorList([PhraseNoRepeatNGram(2, vocab, [])])
    out = generate_verified(llama, prompt, 16, gamma=1.0, context=context, logits_processor=guard, draft=drafter.draft)
    new = out.sequences[0, prompt.shape[1] :].tolist()
    assert new == reference[: len(new)] and out.steps < len(new)
    grams = list(zip(prompt[0].tolist() + new, (prompt[0].tolist() + new)[1:]))
    assert len(grams) == len(set(grams))


def test_relaxed_rule_keeps_a_token_within_gamma_of_the_best():
    probs = torch.tensor([0.5, 0.3, 0.2])
    assert accept_relaxed(probs, 0, 1.0) and not accept_relaxed(probs, 1, 1.0)
    assert accept_relaxed(probs, 1, 0.5) and not accept_relaxed(probs, 2, 0.5)
    assert accept_relaxed(probs, 2, 0.4)


@pytest.mark.parametrize("gamma, kept", [(1.0, [1, 2]), (0.7, [1, 2]), (0.5, [1, 3, 1, 3, 1]), (0.005, [1, 3, 1, 3, 0, 1])])
def test_relaxed_verification_keeps_exactly_the_drafted_tokens_the_rule_allows(gamma, kept):
    # after 0 and 3: 1 is best (p .97), 0 has p .01 (ratio .0103); after 1: 2 is best (p .5), 3 has p .3 (ratio .6)
    table = torch.log(torch.tensor([
        [0.01, 0.97, 0.01, 0.01],
        [0.1, 0.1, 0.5, 0.3],
        [0.02, 0.02, 0.94, 0.02],
        [0.01, 0.97, 0.01, 0.01],
    ]))
    lm = TableLM(table)
    drafts = iter([[1, 3, 1, 3, 0]] + [[]] * 10)  # the first step copies 1 3 1 3 0 as far as the LM vouches
    out = generate_verified(lm, torch.tensor([[0]]), 2, gamma=gamma, draft=lambda text: next(drafts))
    assert out.sequences[0, 1:].tolist() == kept  # the first step's kept copy, then the LM's own token


def test_speculative_sampling_keeps_the_lm_distribution_whatever_is_drafted():
    torch.manual_seed(0)
    table = torch.log_softmax(torch.randn(4, 4) * 1.5, dim=-1)
    lm = TableLM(table)
    probs = table.exp()
    exact = {(a, b): float(probs[0, a] * probs[a, b]) for a, b in itertools.product(range(4), repeat=2)}
    counts = dict.fromkeys(exact, 0)
    draws = 3000
    for _ in range(draws):  # every step proposes 3 3 3: accepted or not, the two tokens keep the LM's law
        out = generate_verified(lm, torch.tensor([[0]]), 2, gamma=0.5, do_sample=True, draft=lambda text: [3, 3, 3])
        a, b = out.sequences[0, 1:3].tolist()
        counts[(a, b)] += 1
    distance = 0.5 * sum(abs(counts[k] / draws - exact[k]) for k in exact)
    assert distance < 0.04, (distance, counts, exact)


def test_speculative_sampling_keeps_the_lm_distribution_of_every_row_of_a_batch():
    """Two rows decoded together, each drafting differently: each row's two tokens keep the LM's law."""
    torch.manual_seed(3)
    table = torch.log_softmax(torch.randn(4, 4) * 1.5, dim=-1)
    probs = table.exp()
    exact = {(a, b): float(probs[0, a] * probs[a, b]) for a, b in itertools.product(range(4), repeat=2)}
    counts = [dict.fromkeys(exact, 0), dict.fromkeys(exact, 0)]
    draws = 2000
    rows = [VerifiedRow([0], draft=lambda text: [3, 3, 3]), VerifiedRow([0], draft=lambda text: [1, 2])]
    for _ in range(draws):
        for count, out in zip(counts, generate_verified_batch(TableLM(table), rows, 2, gamma=0.5, do_sample=True)):
            count[tuple(out.sequences[0, 1:3].tolist())] += 1
    for count in counts:
        distance = 0.5 * sum(abs(count[k] / draws - exact[k]) for k in exact)
        assert distance < 0.05, (distance, count, exact)


def test_nucleus_sampling_with_drafts_keeps_the_lm_nucleus_distribution():
    """top_p = 0.7: each step's law is the LM's, cut to its nucleus and renormalised, whatever the drafts propose
    (3 lies outside the nucleus after 0, so a draft of it is always refused there)."""
    table = torch.log(torch.tensor([[0.45, 0.3, 0.15, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25] * 4, [0.5, 0.3, 0.1, 0.1]]))
    lm = TableLM(table)

    def nucleus(row: torch.Tensor) -> torch.Tensor:
        order = row.argsort(descending=True)
        keep = row[order].cumsum(0) - row[order] < 0.7  # the smallest set whose mass reaches top_p
        law = torch.zeros_like(row)
        law[order[keep]] = row[order[keep]]
        return law / law.sum()

    laws = torch.stack([nucleus(row) for row in table.exp()])
    exact = {(a, b): float(laws[0, a] * laws[a, b]) for a, b in itertools.product(range(4), repeat=2)}
    counts = dict.fromkeys(exact, 0)
    torch.manual_seed(2)
    draws = 3000
    for _ in range(draws):
        out = generate_verified(lm, torch.tensor([[0]]), 2, gamma=0.5, do_sample=True, top_p=0.7,
                                draft=lambda text: [3, 1, 3])
        counts[tuple(out.sequences[0, 1:3].tolist())] += 1
    assert all(counts[(a, b)] == 0 for (a, b), p in exact.items() if p == 0)  # never outside the nucleus
    distance = 0.5 * sum(abs(counts[k] / draws - exact[k]) for k in exact)
    assert distance < 0.04, (distance, counts, exact)


def test_speculative_sampling_refuses_what_a_greedy_copy_would_keep():
    """The same drafts kept without the test would skew the law: token 3 after 0 has p .1, not the 1 it would get."""
    table = torch.log(torch.tensor([[0.3, 0.3, 0.3, 0.1]] * 4))
    lm = TableLM(table)
    torch.manual_seed(1)
    seconds = [generate_verified(lm, torch.tensor([[0]]), 2, gamma=1.0, do_sample=True,
                                 draft=lambda text: [3, 3]).sequences[0, 2].item() for _ in range(1000)]
    assert 0.06 < seconds.count(3) / 1000 < 0.14


def test_cited_spans_stand_at_their_offsets_in_their_documents(tokenizer):
    documents = ["Mountains rise above the valley floor.", DOCUMENT.strip()]
    continuation = " Then it flows south through the old town to the harbour, and the valley floor is green."
    ids = tokenizer(continuation).input_ids
    citations = cite(ids, documents, tokenizer, min_tokens=4)
    text = tokenizer.decode(ids)
    assert [c.text for c in citations] == ["flows south through the old town to the", "the valley floor"][:len(citations)]
    assert citations[0].document == 1
    for c in citations:
        assert text[c.start : c.end] == c.text
        assert documents[c.document][c.document_start : c.document_start + len(c.text)] == c.text
    assert 0.3 < cited_share(citations, text) < 0.8
    assert cite(ids, documents, tokenizer, min_tokens=12) == []
    with pytest.raises(ValueError, match="min_tokens"):
        cite(ids, documents, tokenizer, min_tokens=0)


def test_grounded_decoding_refuses_a_bad_gamma_or_context(llama, tokenizer):
    prompt = tokenizer(" The city of", return_tensors="pt").input_ids
    with pytest.raises(ValueError, match="gamma"):
        generate_verified(llama, prompt, 2, gamma=1.5)
    with pytest.raises(ValueError, match="context must be"):
        generate_verified(llama, prompt, 2, gamma=1.0, context=prompt[0])
    with pytest.raises(ValueError, match="no phrase table"):
        generate_verified(llama, prompt, 2)


def test_a_draft_is_relaxed_only_where_relax_allows_it():
    table = torch.log(torch.tensor([
        [0.01, 0.97, 0.01, 0.01],
        [0.1, 0.1, 0.5, 0.3],
        [0.02, 0.02, 0.94, 0.02],
        [0.01, 0.97, 0.01, 0.01],
    ]))
    # 0: the draft whole at gamma 1; n: its first n tokens at gamma 0.5, the rest drafted again the next step
    for relax, kept in ((0, [1, 2]), (5, [1, 3, 1, 3, 1]), (2, [1, 3, 1])):
        drafts = iter([[1, 3, 1, 3, 0]] + [[]] * 10)
        out = generate_verified(TableLM(table), torch.tensor([[0]]), 2, gamma=0.5, draft=lambda text: next(drafts),
                                relax=lambda text: relax)
        assert out.sequences[0, 1:].tolist() == kept


def test_the_drafter_tells_how_long_a_verbatim_run_its_draft_continues():
    document = [5, 6, 7, 8, 9, 10, 11]
    drafter = DocumentDrafter([document], draft_tokens=2, min_context=2)
    assert drafter.draft([1, 2, 7, 8]) == [9, 10] and drafter.anchored([1, 2, 7, 8]) == 2
    assert drafter.draft([1, 2, 7, 8, 9, 10]) == [11] and drafter.anchored([1, 2, 7, 8, 9, 10]) == 4
    copied = DocumentDrafter([document], draft_tokens=2, min_context=2)
    assert copied.draft([5, 6, 7]) == [8, 9] and copied.anchored([5, 6, 7]) == 3
    assert copied.draft([5, 6, 7, 3]) == [] and copied.anchored([5, 6, 7, 3]) == 0  # nothing drafted
    own = DocumentDrafter([], draft_tokens=2, min_context=2)
    assert own.draft([1, 2, 3, 1, 2]) == [3, 1] and own.anchored([1, 2, 3, 1, 2]) == 0  # a draft from the text itself


def test_the_drafter_tells_how_far_the_documents_holding_the_anchor_agree():
    first, second = [1, 2, 3, 4, 5, 6, 7], [9, 2, 3, 4, 5, 8, 7]  # both hold 2 3 4, then part at 6 / 8
    drafter = DocumentDrafter([first, second], draft_tokens=4, min_context=2)
    assert drafter.draft([0, 2, 3, 4]) == [5, 6, 7]  # from the best document
    assert drafter.agreed([0, 2, 3, 4], anchor=3) == 1  # the second goes on 5, then 8
    assert drafter.agreed([0, 2, 3, 4], anchor=2) == 1
    assert drafter.draft([0, 2, 3, 4, 5]) == [6, 7] and drafter.agreed([0, 2, 3, 4, 5], anchor=2) == 0
    held_once = DocumentDrafter([first, second], draft_tokens=4, min_context=2)
    assert held_once.draft([0, 1, 2, 3]) == [4, 5, 6, 7] and held_once.agreed([0, 1, 2, 3], anchor=3) == 4
    alone = DocumentDrafter([first], draft_tokens=4, min_context=2)
    assert alone.draft([0, 2, 3, 4]) == [5, 6, 7] and alone.agreed([0, 2, 3, 4], anchor=3) == 3
    undrafted = DocumentDrafter([first], draft_tokens=4, min_context=2)
    assert undrafted.draft([0, 3, 4, 5, 6, 7]) == [] and undrafted.agreed([0, 3, 4, 5, 6, 7], anchor=2) == 0
    with pytest.raises(ValueError, match="anchor"):
        undrafted.agreed([0, 3, 4, 5, 6, 7], anchor=0)


def test_grounded_relax_relaxes_a_draft_only_as_far_as_its_documents_agree():
    first, second = [1, 2, 3, 4, 5, 6, 7], [9, 2, 3, 4, 5, 8, 7]
    for text, relaxed in (([1, 2, 3, 4], 1), ([0, 9, 3, 4], 0)):  # anchored on 4 tokens, agreed on 1; anchored on 2
        drafter = DocumentDrafter([first, second], draft_tokens=4, min_context=2)
        drafter.draft(text)
        assert grounded_relax(drafter, relax_after=3)(text) == relaxed
    assert grounded_relax(drafter, relax_after=0) is None and grounded_relax(None, relax_after=3) is None


@pytest.mark.parametrize("gamma", [1.0, 0.05])
def test_a_batch_of_prompts_writes_what_each_prompt_writes_alone(base_model, tokenizer, gamma):
    """Rows of different lengths, each with its own documents, drafts and n-gram guard, decoded in one batch: the
    slots a row rejects stay masked in the shared cache and its positions count its own tokens, so each row writes
    exactly what it writes alone (at gamma = 1 the first row, unguarded, writes the LM's own text given its
    documents)."""
    documents = [DOCUMENT, " Mountains rise above the valley floor, and the valley floor is green.", " A"]
    prompts = [" The city of", " In the north of the old country the river", " Bridges"]
    reference = _greedy(base_model, torch.tensor([tokenizer(documents[0]).input_ids + tokenizer(prompts[0]).input_ids]), 60)

    def row(n: int) -> VerifiedRow:
        context = tokenizer(documents[n]).input_ids
        drafted = [context, tokenizer(" zebra").input_ids + reference[3:16]] if n == 0 else [context]
        guard = LogitsProcessorList([PhraseNoRepeatNGram(3, base_model.config.vocab_size, [], "new")] if n else [])
        return VerifiedRow(tokenizer(prompts[n]).input_ids, context, draft=DocumentDrafter(drafted, 6, min_context=1).draft,
                           logits_processor=guard)

    alone = [generate_verified_batch(base_model, [row(n)], 12, gamma=gamma)[0] for n in range(3)]
    heard: list[list[list[int]]] = []  # each step: what each row in it wrote
    together = generate_verified_batch(base_model, [row(n) for n in range(3)], 12, gamma=gamma,
                                       on_batch_step=heard.append)
    assert len(heard[0]) == 3 and sum(map(len, heard)) == sum(out.steps for out in together)
    for one, batched in zip(alone, together):
        assert batched.sequences.tolist() == one.sequences.tolist()
        assert (batched.steps, batched.cut, batched.kept_spans) == (one.steps, one.cut, one.kept_spans)
    assert sum(out.copied_tokens for out in together) > 0  # rows kept drafts of different lengths
    if gamma == 1.0:
        first = together[0].sequences[0, len(tokenizer(prompts[0]).input_ids) :].tolist()
        assert first == reference[: len(first)]


@pytest.mark.parametrize("gamma", [1.0, 0.3])
def test_rows_joining_a_running_batch_write_what_each_writes_alone(base_model, tokenizer, gamma):
    """Rows join between steps, one reading more than the row decoding (its cache gains masked slots on the left)
    and one less: every row writes what it writes alone, and the batch runs on while rows join and leave."""
    documents = [DOCUMENT, " Mountains rise above the valley floor, and the valley floor is green." * 2, ""]
    prompts = [" The city of", " In the north of the old country the river", " Old stone bridges"]

    def row(n: int) -> VerifiedRow:
        context = tokenizer(documents[n]).input_ids if documents[n] else []
        guard = LogitsProcessorList([PhraseNoRepeatNGram(3, base_model.config.vocab_size, [], "new")])
        return VerifiedRow(tokenizer(prompts[n]).input_ids, context, logits_processor=guard,
                           draft=DocumentDrafter([context] if context else [], 6, min_context=1).draft)

    alone = [generate_verified_batch(base_model, [row(n)], 10, gamma=gamma)[0] for n in range(3)]
    batch = VerifiedBatch(base_model, gamma=gamma)
    assert batch.admit([row(0)], 10) == [0]
    batch.step()
    assert batch.admit([row(1)], 10) == [1]  # reads more than the first has so far
    batch.step()
    assert batch.admit([row(2)], 10) == [2]  # reads less than the batch holds
    sizes = []
    while batch:
        sizes.append(len(batch))
        batch.step()
        if batch.attention is not None:  # the cache holds each row's own tokens, and no slot that no row attends to
            assert bool(batch.attention[:, 0].any())
            assert [int(row.sum()) for row in batch.attention] == [batch.states[n].position for n in batch.active]
    assert sizes[0] == 3 and sizes == sorted(sizes, reverse=True)
    for one, joined in zip(alone, batch.outputs()):
        assert joined.sequences.tolist() == one.sequences.tolist()
        assert (joined.steps, joined.cut, joined.kept_spans) == (one.steps, one.cut, one.kept_spans)


def test_a_row_joining_with_its_own_phrases_uses_only_those(llama, tokenizer):
    """The table grows by a joining row's phrases; each row picks among its own (``VerifiedRow.phrases``)."""
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.scorer = PreferPhrases()  # a phrase of the row's own set wins every step
    model.set_phrases([" the river", " of the old town"], mid_sentence_forms=False)
    every = model.vocab_size  # the LM's top-k of every token: each phrase is kept whole
    first = VerifiedRow(tokenizer(" The city of").input_ids, phrases=[0, 1])
    batch = VerifiedBatch(model, accept_top_k=every)
    batch.admit([first], 6)
    batch.step()
    model.add_phrases([" a green valley"], mid_sentence_forms=False)
    second = VerifiedRow(tokenizer(" Far").input_ids, phrases=[2])
    batch.admit([second], 6)
    while batch:
        batch.step()
    owns = ({" the river", " of the old town"}, {" a green valley"})
    for spec, joined, own in zip((first, second), batch.outputs(), owns):
        alone = generate_verified_batch(model, [spec], 6, accept_top_k=every)[0]
        assert joined.sequences.tolist() == alone.sequences.tolist()
        phrases = [model.phrase_table.phrases[i - every].text for i in joined.sequences[0].tolist() if i >= every]
        assert phrases and set(phrases) <= own


def test_a_batch_of_prompts_with_their_own_phrase_sets_writes_what_each_writes_alone(llama, tokenizer):
    """The paper's verified mode in a batch: each row picks among its own phrases (per-row ``set_phrases``)."""
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.scorer = PreferPhrases()  # a phrase of the row's own set wins every step
    model.set_phrases([[" the river", " of the old town"], [" a green valley"]], mid_sentence_forms=False)
    rows = [VerifiedRow(tokenizer(" The city of").input_ids, row=0), VerifiedRow(tokenizer(" Far").input_ids, row=1)]
    every = model.vocab_size  # the LM's top-k of every token: each phrase is kept whole
    together = generate_verified_batch(model, rows, 6, accept_top_k=every)
    for spec, batched, own in zip(rows, together, ({" the river", " of the old town"}, {" a green valley"})):
        alone = generate_verified(model, torch.tensor([spec.input_ids]), 6, accept_top_k=every, row=spec.row)
        assert batched.sequences.tolist() == alone.sequences.tolist()
        phrases = [model.phrase_table.phrases[i - model.vocab_size].text for i in batched.sequences[0].tolist()
                   if i >= model.vocab_size]
        assert phrases and set(phrases) <= own  # phrases of the row's own set, and only those
    with pytest.raises(ValueError, match="past_key_values holds one prompt's prefix"):
        from transformers import DynamicCache

        generate_verified_batch(model, rows, 6, past_key_values=DynamicCache())


def test_no_new_tokens_asked_writes_nothing(llama, tokenizer):
    rows = [VerifiedRow(tokenizer(" The city of").input_ids), VerifiedRow(tokenizer(" Far").input_ids)]
    outputs = generate_verified_batch(llama, rows, 0, gamma=1.0)
    assert [out.sequences[0].tolist() for out in outputs] == [row.input_ids for row in rows]
    assert [out.steps for out in outputs] == [0, 0]


def test_grounded_fill_cuts_the_corpus_draft_before_a_text_where_the_step_would_do_otherwise():
    corpus = CorpusDrafts([[1, 2, 3, 5, 6, 9]], context_tokens=2)
    drafter = DocumentDrafter([[5, 6, 7, 8]], 4, corpus=corpus, fill_tokens=4)
    assert drafter.fill([1, 2]) == [3, 5, 6, 9]
    assert grounded_fill(drafter, None)([1, 2]) == [3, 5, 6]  # after (5, 6) the document drafts: not filled
    assert grounded_fill(drafter, None)([0, 5, 6]) == []  # a quiet text only
    assert grounded_fill(drafter, lambda text: 1)([1, 2]) == []  # nor where a relaxation is in force
    assert grounded_fill(DocumentDrafter([[5, 6, 7, 8]], 4), None) is None and grounded_fill(None, None) is None


@pytest.mark.parametrize("gamma", [1.0, 0.05])
def test_corpus_fills_write_the_same_text_in_fewer_steps(base_model, tokenizer, gamma):
    """Drafts from a corpus holding the LM's own text, where the documents hold nothing: kept at gamma 1 and only
    where the step would have written the LM's own token, so the text is the one written without them."""
    context = tokenizer(DOCUMENT).input_ids
    prompt = tokenizer(" The city of", return_tensors="pt").input_ids
    reference = _greedy(base_model, torch.cat([torch.tensor([context]), prompt], 1), 24 * 5)  # a step keeps 5 at most

    def decode(corpus):
        drafter = DocumentDrafter([context], 6, min_context=2, corpus=corpus, fill_tokens=4)
        relax = grounded_relax(drafter, 2)
        return generate_verified(base_model, prompt, 24, gamma=gamma, context=torch.tensor([context]),
                                 draft=drafter.draft, relax=relax, fill=grounded_fill(drafter, relax))

    plain = decode(None).sequences[0].tolist()
    filled = decode(CorpusDrafts([tokenizer(" zebra").input_ids + reference, [7, 8, 9]])).sequences[0].tolist()
    assert filled[: len(plain)] == plain and len(filled) > len(plain)  # the same text, more of it in as many steps
    if gamma == 1.0:
        assert filled[prompt.shape[1] :] == reference[: len(filled) - prompt.shape[1]]
