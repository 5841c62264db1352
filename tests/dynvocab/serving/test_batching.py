"""Requests decoded together equal each one decoded alone, token for token (tiny float32 model, greedy); the queue
is bounded; a bad request never disturbs the others."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from dynvocab.serving.engine import running_batch
from dynvocab.serving.engine.engine import Job
from dynvocab.serving.engine.errors import ApiError
from dynvocab.serving.engine.requests import CompletionRequest

from .documents import DOCS

#: rows with different phrase sources, lengths, limits and stops; one bare; three retrieve (two with one search)
REQUESTS = [
    {"prompt": "The city of New York", "max_tokens": 10, "documents": [DOCS[0]["text"]]},
    {"prompt": "Paris", "max_tokens": 7, "retrieve": 2},
    {"prompt": "The river that flows through", "max_tokens": 8, "retrieve": 2},  # shares the search above
    {"prompt": "Greater Tokyo is", "max_tokens": 6, "retrieve": 1},
    {"prompt": "We walked along the river and saw", "max_tokens": 12, "phrases": ["the Hudson River", "Greater Tokyo"]},
    {"prompt": "The cat sat on the mat and", "max_tokens": 9},
    {"prompt": "Tokyo is", "max_tokens": 11, "documents": [DOCS[2]["text"], DOCS[1]["text"]], "stop": [" the"]},
    # gated rows: a phrase follows only the tokens it follows in the row's documents (1 and 2 tokens of context)
    {"prompt": "Tokyo is the capital of", "max_tokens": 6, "documents": [DOCS[2]["text"]], "context_tokens": 1},
    {"prompt": "New York City lies on", "max_tokens": 6, "retrieve": 1, "context_tokens": 2},
]
REQUESTS = [fields | {"grounded": False} for fields in REQUESTS]  # the paper's mode: they share the running batch


def job(engine, fields: dict, number: int) -> Job:
    """A checked job of ``fields``, greedy, in the paper's mode unless ``fields`` names ``grounded`` (this module
    tests the running batch, which grounded requests leave: they decode alone)."""
    request = CompletionRequest.model_validate({"temperature": 0, "agreement_top_k": 0, "grounded": False, **fields})
    prompt_ids, phrases, documents, settings, _ = engine.check(request)
    steps, done = [], []
    made = Job(request, f"r{number}", prompt_ids, phrases, documents, settings,
               engine.batch_key(request, settings, f"r{number}"), steps.append, done.append, done.append)
    made.steps, made.done = steps, done
    return made


@pytest.mark.parametrize("phrases_win", [False, True], ids=["model-scores", "phrases-win"])
@pytest.mark.parametrize("max_batch_size", [len(REQUESTS), 3], ids=["all-at-once", "joining-mid-batch"])
@pytest.mark.parametrize("readback", ["tokens", "vector"])
def test_a_batch_equals_each_request_alone(make_engine, monkeypatch, phrases_win, max_batch_size, readback):
    """With room for 3 rows, the later requests join the running batch as earlier ones end: longer prompts than the
    batch's, shorter ones, after steps that read phrases back (several slots); the table compacts at every leave."""
    monkeypatch.setattr(running_batch, "SPARE_PHRASES", 0)
    engine = make_engine(phrases_win, max_batch_size=max_batch_size)
    requests = [fields | {"readback": readback} for fields in REQUESTS]
    alone = [engine.run([job(engine, fields, n)])[0] for n, fields in enumerate(requests)]
    together_jobs = [job(engine, fields, n) for n, fields in enumerate(requests)]
    assert len({j.key for j in together_jobs}) == 1
    together = engine.run(together_jobs)
    if phrases_win:
        assert sum(c.phrase_steps for c in alone) > 5  # the rows really wrote phrases, each from its own set
    for single, batched, batched_job in zip(alone, together, together_jobs):
        assert batched.text == single.text
        assert batched.segments == single.segments
        assert (batched.finish_reason, batched.completion_tokens) == (single.finish_reason, single.completion_tokens)
        assert "".join(step["text"] for step in batched_job.steps) == batched.text


def test_rows_that_retrieve_alike_share_one_search(make_engine, monkeypatch):
    engine = make_engine(max_batch_size=len(REQUESTS))
    index, searches = engine.corpora["wiki"], []
    search = index.search_documents
    monkeypatch.setattr(index, "search_documents", lambda queries, k: searches.append((len(queries), k)) or search(queries, k))
    engine.run([job(engine, fields, n) for n, fields in enumerate(REQUESTS)])
    assert sorted(searches) == [(2, 1), (2, 2)]


def test_a_gated_row_writes_a_phrase_only_after_the_tokens_it_follows_in_its_documents(make_engine):
    engine = make_engine(phrases_win=True)
    tokenizer = engine.model.tokenizer
    fields = {"prompt": "New York City is the most populous city in the", "max_tokens": 8, "documents": [DOCS[0]["text"]]}
    free, gated = (engine.run([job(engine, fields | extra, n)])[0] for n, extra in enumerate([{}, {"context_tokens": 1}]))
    assert free.phrase_steps > gated.phrase_steps >= 1  # phrases always win where they may: the gate holds most back
    document = tokenizer(DOCS[0]["text"], add_special_tokens=False).input_ids
    text = fields["prompt"]
    for segment in gated.segments:
        if segment["type"] == "phrase":
            before = tokenizer(text, add_special_tokens=False).input_ids[-1]
            phrase = tokenizer(segment["text"], add_special_tokens=False).input_ids
            assert any(document[i - 1] == before and document[i : i + len(phrase)] == phrase for i in range(1, len(document)))
        text += segment["text"]


def test_a_seeded_sampled_request_decodes_alone_and_greedy_ones_share(make_engine):
    engine = make_engine()
    sampled = [job(engine, {"prompt": "a", "temperature": 0.8, "seed": 1}, n) for n in range(2)]
    greedy = [job(engine, {"prompt": "a", "seed": n}, n) for n in range(2)]
    assert sampled[0].key != sampled[1].key
    assert greedy[0].key == greedy[1].key


def test_concurrent_http_requests_are_batched_and_equal_their_answers_alone(make_client):
    client = make_client(phrases_win=True, batch_wait_ms=300.0)

    def step_metrics() -> tuple[float, float]:
        metrics = dict(line.rsplit(" ", 1) for line in client.get("/metrics").text.splitlines() if line[:1] != "#")
        return float(metrics["dynvocab_batch_size_sum"]), float(metrics["dynvocab_batch_size_count"])

    bodies = [{"temperature": 0, "agreement_top_k": 0, **fields} for fields in REQUESTS]
    alone = [client.post("/v1/completions", json=body).json() for body in bodies]
    rows_alone, steps_alone = step_metrics()
    # a request's first id comes from its prefill; each later one from a decoding step
    assert rows_alone == steps_alone == sum(reply["usage"]["completion_tokens"] - 1 for reply in alone)
    bad = {"prompt": "x", "phrases": ["fine phrase", "bad <|endoftext|> phrase"], "temperature": 0}
    with ThreadPoolExecutor(len(bodies) + 1) as pool:
        replies = list(pool.map(lambda body: client.post("/v1/completions", json=body), [*bodies, bad]))
    assert replies[-1].status_code == 400 and "special token" in replies[-1].json()["error"]["message"]
    assert [r.json()["choices"][0] for r in replies[:-1]] == [reply["choices"][0] for reply in alone]
    rows, steps = step_metrics()
    assert rows - rows_alone == rows_alone  # the same rows were decoded (the bad request never reached one) ...
    assert steps - steps_alone < steps_alone / 2  # ... in fewer steps: they shared them


def test_a_full_queue_answers_503_with_retry_after(make_client):
    client = make_client(max_queue=1, max_batch_size=1, batch_wait_ms=0.0)
    engine = client.app.state.engine
    release, started = threading.Event(), threading.Event()
    admissions = engine._admissions

    def held_admissions(jobs):
        started.set()
        release.wait(30)
        return admissions(jobs)

    engine._admissions = held_admissions
    request = {"prompt": "The cat", "max_tokens": 2, "temperature": 0}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.post, "/v1/completions", json=request)
        assert started.wait(30)  # the first request is decoding
        second = pool.submit(client.post, "/v1/completions", json=request)
        while len(client.app.state.batcher) < 1:  # the second waits in the queue
            pass
        refused = client.post("/v1/completions", json=request)
        release.set()
        assert first.result().status_code == 200 and second.result().status_code == 200
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "queue is full" in refused.json()["error"]["message"]
    assert 'dynvocab_errors_total{kind="queue_full"} 1.0' in client.get("/metrics").text


def test_a_stopping_batcher_refuses_new_requests_and_fails_the_queued_ones(make_engine):
    import asyncio

    from dynvocab.serving.engine.scheduler import Batcher
    from dynvocab.serving.http.metrics import ServerMetrics

    engine = make_engine(shutdown_timeout=0.0)
    batcher = Batcher(engine, engine.config, ServerMetrics())
    queued = job(engine, {"prompt": "The cat"}, 0)
    batcher.submit(queued)  # never started: it stays queued
    asyncio.run(batcher.stop())
    assert not queued.steps and queued.done[0].status == 503 and queued.done[0].code == "shutting_down"
    with pytest.raises(ApiError) as refused:
        batcher.submit(job(engine, {"prompt": "The cat"}, 1))
    assert refused.value.status == 503 and refused.value.headers["Retry-After"]


#: state-gated rows (``state_threshold``): each row's phrases are keyed by its own documents' states
GATED = [
    {"prompt": "New York City is the most populous city in the", "max_tokens": 9, "documents": [DOCS[0]["text"]]},
    {"prompt": "Tokyo is the capital of", "max_tokens": 7, "retrieve": 2},
    {"prompt": "Paris", "max_tokens": 10, "documents": [DOCS[1]["text"], DOCS[2]["text"]]},
    {"prompt": "The Seine river flows through", "max_tokens": 6, "retrieve": 1, "phrases": ["the Hudson River"]},
]
GATED = [fields | {"grounded": False} for fields in GATED]


@pytest.mark.parametrize("readback", ["tokens", "vector"])
def test_a_state_gated_batch_equals_each_request_alone(make_engine, monkeypatch, readback):
    """Rows join a running batch of two and leave it; the table compacts (phrase ids renumbered) at every leave."""
    monkeypatch.setattr(running_batch, "SPARE_PHRASES", 0)
    engine = make_engine(phrases_win=True, max_batch_size=2)
    requests = [fields | {"readback": readback, "state_threshold": 0.5, "phrase_max_uses": 0} for fields in GATED]
    alone = [engine.run([job(engine, fields, n)])[0] for n, fields in enumerate(requests)]
    ungated = [engine.run([job(engine, fields | {"state_threshold": None}, n)])[0] for n, fields in enumerate(requests)]
    together = engine.run([job(engine, fields, n) for n, fields in enumerate(requests)])
    assert 0 < sum(c.phrase_steps for c in alone) < sum(c.phrase_steps for c in ungated)  # the gate holds some back
    for single, batched in zip(alone, together):
        assert (batched.text, batched.segments) == (single.text, single.segments)
    assert engine.document_states.misses == 3  # each document's states read once, by the first request that had it


@pytest.mark.parametrize("threshold", [0.5, 0.9])
def test_a_state_gated_row_writes_a_phrase_exactly_where_its_state_meets_a_key(make_engine, threshold):
    """Brute force: at every step, the LM's state over the text so far against its state before each place one of
    the row's phrases starts in the documents. Phrases win wherever they may, so a phrase is written iff one is open."""
    engine = make_engine(phrases_win=True)
    model, documents = engine.model, [DOCS[0]["text"], DOCS[2]["text"]]
    fields = {"prompt": "New York City is the most populous city in the", "max_tokens": 12, "documents": documents,
              "state_threshold": threshold, "phrase_max_uses": 0}
    rows = []
    completion = engine._completion
    engine._completion = lambda prepared, row: rows.append(list(row.ids)) or completion(prepared, row)
    assert engine.run([job(engine, fields, 0)])[0].phrase_steps >= 1
    decoder, table, vocab = model.lm.get_decoder(), model.phrase_table, model.vocab_size

    def last_state(ids: list[int]) -> torch.Tensor:
        return torch.nn.functional.normalize(decoder(input_ids=torch.tensor([ids])).last_hidden_state[0, -1], dim=-1)

    with torch.no_grad():
        keys = {}  # phrase index -> the states before its places in the documents
        for document in model.tokenizer(documents, add_special_tokens=False).input_ids:
            for p, tokens in enumerate(table.token_ids):
                for i in range(1, len(document) - len(tokens) + 1):
                    if tuple(document[i : i + len(tokens)]) == tokens:
                        keys.setdefault(p, []).append(last_state(document[:i]))
        physical = model.tokenizer(fields["prompt"])["input_ids"]
        for chosen in rows[0]:
            state = last_state(physical)
            cosines = {p: max((key @ state).item() for key in states) for p, states in keys.items()}
            best = max(cosines.values(), default=-2.0)
            if abs(best - threshold) > 1e-4:  # clear of the threshold, where float rounding cannot flip it
                assert (chosen >= vocab) == (best >= threshold)
            if chosen >= vocab:
                assert cosines.get(chosen - vocab, -2.0) >= threshold - 1e-4
            physical += list(table.token_ids[chosen - vocab]) if chosen >= vocab else [chosen]
