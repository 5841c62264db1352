"""The core's GPU paths give what its CPU paths give: ``pytest -m gpu`` on a machine with a CUDA device.

Everywhere else these tests are skipped: the suite's default marker filter leaves them out, and they skip
without CUDA. ``tests/dynvocab/training/test_state_cache.py`` covers the state cache's GPU build when run there, and
``tests/dynvocab/scoring/test_shortlist.py`` the shortlist's torch gather on the GPU.
"""

import copy

import pytest
import torch

from dynvocab import DynamicVocabLM, ShortlistConfig, ShortlistScorer
from dynvocab.decoding.citations import cite
from dynvocab.decoding.drafting import DocumentDrafter
from dynvocab.decoding.verification import VerifiedRow, generate_verified, generate_verified_batch
from dynvocab.hardware.precision import encode_autocast_dtype
from tests.helpers import PhrasesAlwaysWin, RandomScorer, TableLM

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")
READBACK_PHRASES = [" New York City", " the United States", " of the big", " in the"]
PROMPTS = ["Hello world, this is", "A longer prompt about the weather today", "x"]
WORDS = "river mountain city harbour castle valley forest island bridge tower market garden".split()
SHORTLIST_PHRASES = [f" {a} by the {b}" for a in WORDS for b in WORDS if a != b][:90]


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
    """TF32 would round float32 products on the GPU and flip near ties: compare exact float32 on both devices."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous


def _readback_model(base_model, tokenizer) -> DynamicVocabLM:
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer).eval()
    model.scorer = RandomScorer(base_model.config.hidden_size, len(READBACK_PHRASES))
    model.set_phrases([READBACK_PHRASES, READBACK_PHRASES[1:3], READBACK_PHRASES[3:]])  # per-row sets
    return model


def test_token_readback_decoding_on_the_gpu_writes_what_the_cpu_writes(base_model, tokenizer):
    model = _readback_model(base_model, tokenizer)
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    settings = [{}, {"num_beams": 3}, {"no_repeat_ngram_size": 2}, {"use_cache": False}]
    with torch.no_grad():
        on_cpu = [model.generate(**batch, max_new_tokens=16, do_sample=False, **kw) for kw in settings]
        model.to(CUDA)
        on_gpu = [model.generate(**batch.to(CUDA), max_new_tokens=16, do_sample=False, **kw) for kw in settings]
    assert bool((on_cpu[0][:, -16:] >= model.vocab_size).any())  # phrases were emitted and read back
    for kw, cpu, gpu in zip(settings, on_cpu, on_gpu):
        assert gpu.device.type == "cuda" and gpu.cpu().tolist() == cpu.tolist(), kw


def test_the_shortlist_written_into_the_logits_on_the_gpu(llama, tokenizer):
    """On the GPU the head gathers with torch and the model scatters the candidates into the logits: the logits are the
    LM's beside the scorer's calibrated dense scores, and probing every cluster gives exact scoring's logits."""
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval().to(CUDA)
    model.dynvocab_config.phrase_score_scale, model.dynvocab_config.phrase_score_bias = 0.5, 2.0
    model.set_phrases([SHORTLIST_PHRASES[:50], SHORTLIST_PHRASES[30:]])
    prompt = tokenizer(["The castle by the river and", "A market in the old town"], return_tensors="pt",
                       padding=True).to(CUDA)
    with torch.no_grad():
        exact = model(**prompt).logits
        model.scorer = ShortlistScorer(model.phrase_table, ShortlistConfig(cluster_size=4, probe=1000, subset_size=4,
                                                                           exact_below=1))
        torch.testing.assert_close(model(**prompt).logits, exact, atol=1e-5, rtol=1e-5)
        model.scorer = ShortlistScorer(model.phrase_table, ShortlistConfig(cluster_size=4, probe=3, subset_size=0,
                                                                           exact_below=1))
        seen = []
        hook = model.lm.get_output_embeddings().register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0]))
        logits = model(**prompt).logits
        hook.remove()
        dense = model.scorer(seen[0], model.phrase_output_vectors(), model.phrase_table.row_masks().to(CUDA))
        lm_logits = model.lm(**prompt).logits
    assert logits.device.type == "cuda" and torch.isfinite(dense).any() and torch.isinf(dense).any()
    assert model.scorer.head.centroids.device.type == "cuda"
    assert torch.equal(logits, torch.cat([lm_logits, dense * 0.5 + 2.0], dim=-1))


def test_verified_drafting_on_the_gpu_writes_the_bare_lm_text_in_fewer_steps(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval().to(CUDA)
    prompt = tokenizer("The city of", return_tensors="pt").input_ids.to(CUDA)
    with torch.no_grad():
        bare = model.lm.generate(prompt, max_new_tokens=64, do_sample=False)[0, prompt.shape[1]:].tolist()
    drafter = DocumentDrafter([prompt[0].tolist() + bare[:40]], 6, step_cost=0.0)
    out = generate_verified(model, prompt, 12, accept_top_k=1, draft=drafter.draft)
    new = out.sequences[0, prompt.shape[1]:].tolist()
    assert new == bare[: len(new)] and len(new) >= 24 and out.steps == 12


def test_phrase_vectors_encoded_on_the_gpu_under_the_auto_policy(llama, tokenizer):
    """``auto`` encodes under bf16 autocast on a GPU that computes bf16: the vectors are the CPU's float32 ones to bf16
    precision."""
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    torch.nn.init.normal_(model.phrase_encoder.head[-1].weight, std=0.1)
    on_gpu_model = copy.deepcopy(model).to(CUDA)  # its own phrase cache: nothing encoded on the CPU is served
    model.set_phrases(SHORTLIST_PHRASES)
    on_gpu_model.set_phrases(SHORTLIST_PHRASES)
    on_cpu, on_gpu = model.phrase_output_vectors().float(), on_gpu_model.phrase_output_vectors()
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    assert model.dynvocab_config.encode_dtype == "auto" and encode_autocast_dtype("auto", CUDA) == expected
    assert on_gpu.device.type == "cuda"
    cosines = torch.nn.functional.cosine_similarity(on_gpu.float().cpu(), on_cpu, dim=-1)
    assert float(cosines.min()) > 0.99


def test_grounded_decoding_on_the_gpu_writes_the_lm_text_given_the_documents(base_model, tokenizer):
    """gamma = 1 on the GPU: phrases and drafts from the documents propose, the LM reading the documents keeps only
    its own greedy tokens, so the text is ``generate``'s given the documents; its copied spans cite them."""
    lm = base_model.to(CUDA)
    model = DynamicVocabLM.from_causal_lm(lm, tokenizer).eval()
    model.scorer = PhrasesAlwaysWin()
    context = tokenizer(" The river rises in the northern hills and flows south.", return_tensors="pt").input_ids.to(CUDA)
    prompt = tokenizer(" The city of", return_tensors="pt").input_ids.to(CUDA)
    with torch.no_grad():
        ids = torch.cat([context, prompt], 1)
        reference = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=96,
                                do_sample=False)[0, ids.shape[1]:].tolist()
    model.set_phrases([tokenizer.decode(reference[:1]) + " zebra crossing", tokenizer.decode(reference[6:10])],
                      mid_sentence_forms=False)
    documents = [tokenizer(" zebra crossing").input_ids + reference[2:20], context[0].tolist()]
    drafter = DocumentDrafter(documents, draft_tokens=6, min_context=1, step_cost=0.0)
    out = generate_verified(model, prompt, 16, gamma=1.0, context=context, draft=drafter.draft)
    table, vocab = model.phrase_table, model.vocab_size
    spelled = [t for i in out.sequences[0, prompt.shape[1]:].tolist()
               for t in (table.token_ids[i - vocab] if i >= vocab else (i,))]
    assert out.sequences.device.type == CUDA.type
    assert spelled == reference[: len(spelled)] and len(spelled) > out.steps and out.cut >= 1
    texts = [tokenizer.decode(document) for document in documents]
    citations = cite(spelled, texts, tokenizer, min_tokens=4)
    assert citations and all(texts[c.document][c.document_start :].startswith(c.text) for c in citations)


def test_speculative_sampling_on_the_gpu_keeps_the_lm_distribution():
    """Sampled grounded decoding on the GPU (its draws and tests on the device): whatever is drafted, two tokens
    follow the LM's own law."""
    torch.manual_seed(0)
    table = torch.log_softmax(torch.randn(4, 4) * 1.5, dim=-1)
    lm = TableLM(table.to(CUDA))
    probs = table.exp()
    exact = {(a, b): float(probs[0, a] * probs[a, b]) for a in range(4) for b in range(4)}
    counts = dict.fromkeys(exact, 0)
    draws = 1500
    for _ in range(draws):
        out = generate_verified(lm, torch.tensor([[0]], device=CUDA), 2, gamma=0.5, do_sample=True,
                                draft=lambda text: [3, 3, 3])
        counts[tuple(out.sequences[0, 1:3].tolist())] += 1
    distance = 0.5 * sum(abs(counts[k] / draws - exact[k]) for k in exact)
    assert distance < 0.05, (distance, counts, exact)


def test_a_grounded_batch_on_the_gpu_writes_what_each_prompt_writes_alone(base_model, tokenizer):
    """Rows of different lengths and documents in one batch on the GPU, their refused slots masked out of the shared
    cache: each row writes what it writes alone (at gamma 1 and relaxed)."""
    lm = base_model.to(CUDA)
    documents = [" The river rises in the northern hills and flows south.", " Mountains rise above the green valley.", " A"]
    prompts = [" The city of", " In the north of the old country the river", " Bridges"]
    with torch.no_grad():
        ids = torch.tensor([tokenizer(documents[0]).input_ids + tokenizer(prompts[0]).input_ids], device=CUDA)
        reference = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                                do_sample=False)[0, ids.shape[1]:].tolist()

    def row(n: int) -> VerifiedRow:
        context = tokenizer(documents[n]).input_ids
        drafted = [context, reference[2:16]] if n == 0 else [context]
        return VerifiedRow(tokenizer(prompts[n]).input_ids, context,
                           draft=DocumentDrafter(drafted, 6, min_context=1, step_cost=0.0).draft)

    for gamma in (1.0, 0.05):
        alone = [generate_verified_batch(lm, [row(n)], 10, gamma=gamma)[0] for n in range(3)]
        together = generate_verified_batch(lm, [row(n) for n in range(3)], 10, gamma=gamma)
        assert together[0].sequences.device.type == CUDA.type
        for one, batched in zip(alone, together):
            assert batched.sequences.tolist() == one.sequences.tolist() and batched.kept_spans == one.kept_spans
        assert sum(out.copied_tokens for out in together) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_document_keys_and_values_joined_on_the_gpu_are_the_cpus(dtype):
    from dynvocab.states.kv import DocumentKV
    from tests.helpers import tiny_llama

    lm = tiny_llama(64).to(dtype)
    documents, prompt = [[5, 6, 7, 8, 9, 10], [20, 21, 22, 23]], torch.tensor([[30, 31, 32]])
    on_cpu = lm(prompt, past_key_values=DocumentKV(lm).cache(documents), use_cache=True).logits
    gpu_lm = copy.deepcopy(lm).to(CUDA)
    cache = DocumentKV(gpu_lm).cache(documents)
    assert cache.layers[0].keys.device.type == "cuda" and cache.layers[0].keys.dtype == dtype
    on_gpu = gpu_lm(prompt.to(CUDA), past_key_values=cache, use_cache=True).logits
    tolerance = {"atol": 2e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(on_gpu.cpu().float(), on_cpu.float(), **tolerance)
