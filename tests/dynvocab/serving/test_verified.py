"""Verified requests (``verify_top_k``, drafts with ``draft_tokens``) decode in batches of their rule (one with a
state gate alone): with ``verify_top_k=1`` and ``agreement_top_k=1`` the text is the bare LM's greedy text, in fewer
steps when a document holds it; it streams, stops and is seeded as a running batch's row is."""

import pytest

from retrieval import reading

from .documents import DOCS
from .test_batching import job
from .test_completions import events

PROMPT = "The river that flows through the city"


def decoded(engine, fields: dict) -> tuple:
    """``fields`` decoded through ``engine.decode``: the completion and the rows of each step it heard."""
    waiting, steps, done = [job(engine, fields, 0)], [], []

    def take(key, room):
        taken, waiting[:] = waiting[:room], waiting[room:]
        return taken

    engine.decode(take, lambda _, completion: done.append(completion), lambda rows, *_: steps.append(rows))
    return done[0], steps


@pytest.fixture(autouse=True)
def drafts_always_pay(monkeypatch):
    """A drafted forward call of the tiny model costs what a one-token call does, whatever this machine's timing."""
    monkeypatch.setattr(reading, "draft_step_cost", lambda model, draft_tokens: 0.0)


@pytest.mark.parametrize("max_phrases", [0, 2048], ids=["drafts-only", "phrases-win"])
def test_a_verified_drafted_request_writes_the_bare_lm_s_text(make_engine, max_phrases):
    engine = make_engine(phrases_win=True)
    bare, _ = decoded(engine, {"prompt": PROMPT, "max_tokens": 160})  # 16 ids may hold 128 tokens
    holding_it = {"prompt": PROMPT, "max_tokens": 16, "documents": [PROMPT + bare.text], "max_phrases": max_phrases}
    lossless = {"verify_top_k": 1, "agreement_top_k": 1}  # a phrase starts where the LM's best token does
    steps = {}
    for drafts in (0, 4):  # drafts come from the document, which holds the text
        verified, steps[drafts] = decoded(engine, holding_it | lossless | {"draft_tokens": drafts})
        assert bare.text.startswith(verified.text) and len(verified.text) > 20
        assert (verified.completion_tokens, verified.finish_reason) == (16, "length")  # ids: a phrase counts one
        assert (verified.phrase_steps > 0) is bool(max_phrases) and set(steps[drafts]) == {1}
        assert "".join(s["text"] for s in verified.segments) == verified.text
    if not max_phrases:  # a drafted step keeps several tokens (nothing is drafted after a phrase)
        assert len(steps[0]) == 16 and len(steps[4]) <= 16 // 2
    assert engine.batch_key(*_checked(engine, holding_it | lossless), "a") == \
        engine.batch_key(*_checked(engine, holding_it | lossless), "b")  # requests of one rule share a batch
    gated = holding_it | lossless | {"state_threshold": 0.5}
    assert engine.batch_key(*_checked(engine, gated), "a") != engine.batch_key(*_checked(engine, gated), "b")
    assert engine.batch_key(*_checked(engine, holding_it | lossless), "a") != \
        engine.batch_key(*_checked(engine, holding_it | {"verify_top_k": 2, "agreement_top_k": 1}), "a")


def _checked(engine, fields: dict) -> tuple:
    made = job(engine, fields, 0)
    return made.request, made.settings


def test_a_verified_request_streams_its_steps_and_stops_at_a_stop_string(make_client):
    client = make_client()
    bare = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 120, "temperature": 0}).json()
    text = bare["choices"][0]["text"]
    request = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "documents": [PROMPT + text],
               "verify_top_k": 1, "agreement_top_k": 1, "draft_tokens": 4}
    whole = client.post("/v1/completions", json=request).json()["choices"][0]
    assert text.startswith(whole["text"]) and whole["finish_reason"] == "length"
    streamed = events(client.post("/v1/completions", json=request | {"stream": True}))
    assert streamed[-1] == "[DONE]" and streamed[-2]["choices"][0]["finish_reason"] == "length"
    chunks = [event["choices"][0]["text"] for event in streamed[:-2]]
    assert "".join(chunks) == whole["text"] and len(chunks) == 12  # a chunk per id, as a batched row sends
    stop = whole["text"][len(whole["text"]) // 2 : len(whole["text"]) // 2 + 3]
    cut = client.post("/v1/completions", json=request | {"stop": [stop]}).json()["choices"][0]
    assert cut["text"] == whole["text"][: whole["text"].find(stop)] and cut["finish_reason"] == "stop"


def test_a_seeded_sampled_verified_request_returns_the_same_text_each_time(make_client):
    client = make_client()
    request = {"prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 7, "documents": [DOCS[0]["text"]],
               "verify_top_k": 3, "draft_tokens": 4}
    texts = {client.post("/v1/completions", json=request).json()["choices"][0]["text"] for _ in range(3)}
    others = {client.post("/v1/completions", json=request | {"seed": seed}).json()["choices"][0]["text"]
              for seed in range(8, 12)}
    assert len(texts) == 1 and len(others | texts) > 1


@pytest.mark.parametrize("fields, message", [
    ({"draft_tokens": 4}, "needs verified decoding: pass grounded=True"),
    ({"verify_top_k": 1, "readback": "vector"}, "verified decoding reads each phrase back as its tokens"),
])
def test_a_verified_request_that_cannot_be_decoded_is_refused(make_client, fields, message):
    reply = make_client().post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                                         "documents": ["a b c"], "grounded": False, **fields})
    assert reply.status_code == 400 and message in reply.text


def test_a_verified_request_s_state_gate_closes_phrases_as_a_batched_row_s_does(make_engine):
    """The gate at -1 opens every phrase that has a key (a place past a document's first token); near 1 it keeps
    phrases out where the LM's state is not their state in the documents."""
    engine = make_engine(phrases_win=True)
    request = {"prompt": PROMPT, "max_tokens": 12, "documents": [DOCS[0]["text"], DOCS[1]["text"]],
               "verify_top_k": 10**6}  # every token accepted: a phrase that wins is written whole
    wide_open, _ = decoded(engine, request | {"state_threshold": -1.0})
    narrow, _ = decoded(engine, request | {"state_threshold": 0.9999})
    assert 0 < wide_open.phrase_steps and narrow.phrase_steps < wide_open.phrase_steps
