"""Grounded requests (the default with documents) decode in batches of their rule: the LM reads each request's own
documents and writes every token; with gamma = 1 the text is the LM's own given the documents, alone or batched, and
each copied span cites its document."""

import pytest
import torch

from retrieval import reading
from retrieval.reading import in_context_ids

from .test_batching import job as paper_job


def job(engine, fields: dict, number: int):
    return paper_job(engine, {"grounded": None} | fields, number)  # the server's own default

PROMPT = "The river that flows through the city"


@pytest.fixture(autouse=True)
def drafts_always_pay(monkeypatch):
    monkeypatch.setattr(reading, "draft_step_cost", lambda model, draft_tokens: 0.0)


def decode_all(engine, requests: list[dict], steps: list | None = None) -> list:
    """``requests`` queued together and handed to ``engine.decode`` as the batcher hands them over (the oldest job's
    key first): their completions; ``steps`` hears the rows of each decoding step."""
    waiting, done = [job(engine, fields, n) for n, fields in enumerate(requests)], {}
    names = [made.request_id for made in waiting]

    def take(key, room):
        key = waiting[0].key if key is None and waiting else key
        taken = [made for made in waiting if made.key == key][:room]
        waiting[:] = [made for made in waiting if made not in taken]
        return taken

    engine.decode(take, lambda made, completion: done.__setitem__(made.request_id, completion),
                  (lambda rows, *_: steps.append(rows)) if steps is not None else None)
    return [done[name] for name in names]


def lm_text(engine, documents: list[str], prompt: str, max_tokens: int) -> str:
    """What the engine's LM writes greedily with ``documents`` in its context, as grounded decoding reads them."""
    tokenizer, lm = engine.model.tokenizer, engine.model.lm
    context = in_context_ids(tokenizer, [{"text": d} for d in documents], 384)
    ids = torch.tensor([context + tokenizer(prompt, add_special_tokens=False).input_ids])
    out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_grounded_requests_write_the_lm_text_given_their_documents_alone_and_batched(make_engine):
    engine = make_engine()
    bare = lm_text(engine, [], PROMPT, 48)
    requests = [{"prompt": PROMPT, "max_tokens": 12, "documents": [PROMPT + bare], "gamma": 1.0},
                {"prompt": "A bridge", "max_tokens": 10, "documents": ["The old bridge crosses the river.", "Rivers."],
                 "gamma": 1.0},
                {"prompt": PROMPT, "max_tokens": 12, "documents": ["Nothing about it."], "gamma": 1.0}]
    steps: list[int] = []
    together = decode_all(engine, requests, steps)
    assert steps[0] == 3 and steps == sorted(steps, reverse=True)  # one batch, rows leaving as they end
    for fields, completion in zip(requests, together):
        reference = lm_text(engine, fields["documents"][:2], fields["prompt"], 4 * fields["max_tokens"])
        assert reference.startswith(completion.text) and completion.text
        assert completion.cited_share is not None
        assert decode_all(engine, [fields])[0].text == completion.text  # alone as queued with others
    first = together[0]
    assert first.citations and first.cited_share > 0  # its document holds what the LM writes at first: copied, cited
    for citation in first.citations:
        assert first.text[citation["start"] : citation["end"]] == citation["text"]
        source = requests[0]["documents"][0]
        assert source[citation["offset"] : citation["offset"] + len(citation["text"])] == citation["text"]
        assert citation["document"] == "0"


def test_a_grounded_request_arriving_mid_batch_joins_it_and_writes_what_it_writes_alone(make_engine):
    """Continuous batching of grounded rows: a request queued while a grounded batch decodes joins it at the next
    step (its documents read on their own and laid into the batch's cache) instead of waiting for it to end."""
    engine = make_engine()
    requests = [{"prompt": PROMPT, "max_tokens": 16, "documents": ["The old bridge crosses the river."]},
                {"prompt": "A bridge", "max_tokens": 16, "documents": ["Rivers run to the sea."]},
                {"prompt": "The valley below the town", "max_tokens": 8,
                 "documents": ["The valley below the town is green and wide, and the river runs through it."]}]
    made = [job(engine, fields, n) for n, fields in enumerate(requests)]
    waiting, done, steps = made[:2], {}, []

    def take(key, room):
        if len(steps) == 2 and made[2] not in waiting and made[2].request_id not in done:
            waiting.append(made[2])  # queued after the batch's second step
        taken = [m for m in waiting if key is None or m.key == key][:room]
        waiting[:] = [m for m in waiting if m not in taken]
        return taken

    engine.decode(take, lambda job_, completion: done.__setitem__(job_.request_id, completion),
                  lambda rows, *_: steps.append(rows))
    assert steps[:2] == [2, 2] and steps[2] == 3  # it joined the running batch at its third step
    for fields, queued in zip(requests, made):
        assert done[queued.request_id].text == decode_all(engine, [fields])[0].text  # what it writes alone


def test_a_request_without_documents_or_asking_for_verification_is_not_grounded(make_engine):
    engine = make_engine()
    assert not job(engine, {"prompt": PROMPT}, 0).settings.grounded
    assert job(engine, {"prompt": PROMPT, "documents": ["x y z"]}, 0).settings.grounded
    assert not job(engine, {"prompt": PROMPT, "documents": ["x y z"], "verify_top_k": 1}, 0).settings.grounded
    plain = decode_all(engine, [{"prompt": PROMPT, "max_tokens": 4}])[0]
    assert plain.citations == [] and plain.cited_share is None


def test_a_grounded_response_carries_its_citations(make_client):
    client = make_client()
    body = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                "documents": [{"text": PROMPT + " and more.", "id": "a"}]}).json()
    details = body["dynvocab"]
    assert isinstance(details["citations"], list) and 0.0 <= details["cited_share"] <= 1.0
    refused = client.post("/v1/completions", json={"prompt": PROMPT, "grounded": True, "verify_top_k": 1,
                                                   "documents": ["x"]})
    assert refused.status_code == 400 and "grounded=False for verify_top_k" in refused.text
