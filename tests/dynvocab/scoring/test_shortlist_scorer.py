"""``ShortlistScorer`` inside ``DynamicVocabLM``: exact when it probes everything, in step with a changing table."""

import pytest
import torch

from dynvocab import DynamicVocabLM, ShortlistConfig, ShortlistScorer

WORDS = "river mountain city harbour castle valley forest island bridge tower market garden".split()
PHRASES = [f" {a} by the {b}" for a in WORDS for b in WORDS if a != b][:90]  # 9 first tokens


@pytest.fixture
def model(llama, tokenizer):
    return DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()


def full_probe(table) -> ShortlistScorer:
    """A shortlist that probes every cluster: its scores must equal exhaustive scoring."""
    return ShortlistScorer(table, ShortlistConfig(cluster_size=4, probe=1000, subset_size=4, exact_below=1))


def test_probing_every_cluster_gives_the_exact_logits_and_generations(model, tokenizer):
    model.set_phrases(PHRASES)
    prompt = tokenizer(["The castle by the river", "A market in"], return_tensors="pt", padding=True)
    with torch.no_grad():
        exact = model(**prompt).logits
        greedy = model.generate(**prompt, max_new_tokens=6, do_sample=False)
        beams = model.generate(**prompt, max_new_tokens=5, num_beams=3, do_sample=False)
    model.scorer = full_probe(model.phrase_table)
    with torch.no_grad():
        assert torch.allclose(model(**prompt).logits, exact, atol=1e-5)
        assert torch.equal(model.generate(**prompt, max_new_tokens=6, do_sample=False), greedy)
        assert torch.equal(model.generate(**prompt, max_new_tokens=5, num_beams=3, do_sample=False), beams)
        sampled = model.generate(**prompt, max_new_tokens=4, do_sample=True, top_p=0.9)
    assert sampled.shape[0] == 2 and model.scorer.head.vocab_size == len(model.phrase_table)


def test_a_partial_shortlist_scores_exactly_on_it_and_minus_inf_off_it(model, tokenizer):
    model.set_phrases(PHRASES)
    ids = tokenizer(["The castle by the river"], return_tensors="pt").input_ids
    with torch.no_grad():
        exact = model(ids).logits[..., model.vocab_size :]
        model.scorer = ShortlistScorer(model.phrase_table, ShortlistConfig(cluster_size=4, probe=2, subset_size=0, exact_below=1))
        short = model(ids).logits[..., model.vocab_size :]
    on = torch.isfinite(short)
    assert 0 < int(on[0, -1].sum()) < len(PHRASES)
    assert torch.allclose(short[on], exact[on], atol=1e-5)


def test_small_tables_stay_exact(model, tokenizer):
    model.set_phrases(PHRASES[:10])
    ids = tokenizer(["The castle by the river"], return_tensors="pt").input_ids
    with torch.no_grad():
        exact = model(ids).logits
        model.scorer = ShortlistScorer(model.phrase_table, ShortlistConfig(exact_below=50))
        assert torch.equal(model(ids).logits, exact)
    assert model.scorer.head is None


def test_add_remove_and_per_row_sets_keep_the_head_in_step(model, tokenizer):
    model.scorer = full_probe(model.phrase_table)
    model.set_phrases(PHRASES[:60])
    prompt = tokenizer(["The castle by the river", "A market in"], return_tensors="pt", padding=True)
    with torch.no_grad():
        model(**prompt)
        model.add_phrases(PHRASES[60:])
        grown = model(**prompt).logits
        assert model.scorer.head.vocab_size == len(model.phrase_table) == len(PHRASES)
        removed = [model.phrase_table.id_of(p) for p in PHRASES[:20]]
        model.remove_phrases(PHRASES[:20])  # ids keep their meaning: the columns stay, never to win again
        shrunk = model(**prompt).logits
        assert model.scorer.head.vocab_size == len(model.phrase_table)
        assert bool((shrunk[..., removed] == float("-inf")).all())
        model.set_phrases([PHRASES[:40], PHRASES[30:70]])
        rows = model(**prompt).logits[:, -1, model.vocab_size :]
    assert grown.shape[-1] == model.vocab_size + len(PHRASES)
    assert shrunk.shape[-1] == model.vocab_size + len(PHRASES)
    for row, wanted in enumerate((PHRASES[:40], PHRASES[30:70])):
        allowed = {model.phrase_table.id_of(p) - model.vocab_size for p in wanted}
        assert set(torch.isfinite(rows[row]).nonzero().flatten().tolist()) <= allowed


def test_cached_decoding_matches_uncached(model, tokenizer):
    model.set_phrases(PHRASES)
    model.scorer = ShortlistScorer(model.phrase_table, ShortlistConfig(cluster_size=4, probe=3, subset_size=0, exact_below=1))
    prompt = tokenizer(["The castle by the river"], return_tensors="pt")
    with torch.no_grad():
        cached = model.generate(**prompt, max_new_tokens=6, do_sample=False)
        uncached = model.generate(**prompt, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)


def test_phrases_are_clustered_inside_their_first_token_unless_asked_otherwise(model, tokenizer):
    model.set_phrases(PHRASES)
    scorer = ShortlistScorer(model.phrase_table, ShortlistConfig(cluster_size=4, probe=3, subset_size=0, exact_below=1))
    head = scorer.fit(model.phrase_output_vectors())
    first = {i: ids[0] for i, ids in enumerate(model.phrase_table.token_ids)}
    assert head.grouped
    for cluster, row in enumerate(head.subsets.tolist()):
        assert {first[i] for i in row if i < head.vocab_size} == {int(head.cluster_groups[cluster])}
    whole = ShortlistScorer(model.phrase_table, ShortlistConfig(num_clusters=5, probe=5, subset_size=3, exact_below=1),
                            group_by_first_token=False)
    model.scorer = whole
    ids = tokenizer(["The castle by the river"], return_tensors="pt").input_ids
    with torch.no_grad():
        model(ids)
        model.add_phrases([" the valley road", " a river bridge"])  # the whole-table head takes them without groups
        model(ids)
    assert not whole.head.grouped and whole.head.vocab_size == len(model.phrase_table)


def test_written_in_scores_equal_the_dense_ones_calibrated_and_masked(model, tokenizer, monkeypatch):
    """The model writes the shortlist's candidates into its logits: the same logits as the LM's beside the scorer's
    dense scores, after the calibration, under per-row phrase sets, over several chunks of positions."""
    monkeypatch.setattr("dynvocab.scoring.shortlist_scorer.ROWS_PER_CHUNK", 3)  # 2 rows x 6 positions: 4 chunks
    model.dynvocab_config.phrase_score_scale, model.dynvocab_config.phrase_score_bias = 0.5, 2.0
    config = ShortlistConfig(cluster_size=4, probe=3, subset_size=0, exact_below=1)
    model.scorer = ShortlistScorer(model.phrase_table, config)
    model.set_phrases([PHRASES[:50], PHRASES[30:]])
    prompt = tokenizer(["The castle by the river and", "A market in the old town"], return_tensors="pt", padding=True)
    seen = []
    hook = model.lm.get_output_embeddings().register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0]))
    with torch.no_grad():
        logits = model(**prompt).logits
        hook.remove()
        lm_logits = model.lm(**prompt).logits
        dense = model.scorer(seen[0], model.phrase_output_vectors(), model.phrase_table.row_masks())
        ids, _ = model.scorer.sparse(seen[0], model.phrase_output_vectors())
    assert dense.shape[1] == 6 and torch.isfinite(dense).any() and torch.isinf(dense).any()
    assert bool((ids == len(model.phrase_table)).any())  # rows of different widths: pads are written too
    assert torch.equal(logits, torch.cat([lm_logits, dense * 0.5 + 2.0], dim=-1))
