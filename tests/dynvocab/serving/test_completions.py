"""``/v1/completions`` without and with phrases: the bare LM's text, segments with sources, stops, streams, seeds."""

import json

from .documents import DOCS

# the paper's mode (grounded requests write the LM's tokens); a random tiny LM never agrees with a phrase's first token
PHRASES_ON = {"agreement_top_k": 0, "grounded": False}


def events(response) -> list:
    """The SSE ``data:`` payloads of a streamed reply, ``[DONE]`` as a string."""
    lines = [line[len("data: "):] for line in response.text.split("\n\n") if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


def test_a_request_without_phrase_fields_is_the_bare_lm(make_client):
    client = make_client()
    model = client.app.state.engine.model
    reply = client.post("/v1/completions", json={"prompt": "The cat sat on", "max_tokens": 12, "temperature": 0})
    assert reply.status_code == 200, reply.text
    ids = model.tokenizer("The cat sat on", return_tensors="pt").input_ids
    bare = model.lm.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=model.tokenizer.eos_token_id)
    body = reply.json()
    assert body["choices"][0]["text"] == model.tokenizer.decode(bare[0, ids.shape[1]:], skip_special_tokens=True)
    assert body["usage"] == {"prompt_tokens": ids.shape[1], "completion_tokens": 12, "total_tokens": ids.shape[1] + 12}
    assert body["choices"][0]["finish_reason"] == "length"
    assert {s["type"] for s in body["choices"][0]["segments"]} == {"token"}
    assert body["object"] == "text_completion" and reply.headers["x-request-id"] == body["id"]


def test_phrases_cut_from_documents_name_their_document_and_offset(make_client):
    client = make_client(phrases_win=True)
    documents = [{"id": "nyc", "title": "New York", "text": DOCS[0]["text"]}, DOCS[1]["text"]]
    reply = client.post("/v1/completions", json={"prompt": "The city", "max_tokens": 6, "temperature": 0,
                                                 "documents": documents, **PHRASES_ON}).json()
    phrases = [s for s in reply["choices"][0]["segments"] if s["type"] == "phrase"]
    assert phrases and reply["dynvocab"]["phrase_steps"] == len(phrases)
    texts = {"nyc": DOCS[0]["text"], "1": DOCS[1]["text"]}
    for phrase in phrases:
        source = phrase["source"]
        assert source["document"] in texts
        start = source["offset"]
        assert texts[source["document"]][start : start + len(phrase["text"].strip())] == phrase["text"].strip()
    assert "".join(s["text"] for s in reply["choices"][0]["segments"]) == reply["choices"][0]["text"]


def test_retrieve_takes_phrases_from_the_served_corpus(make_client):
    client = make_client(phrases_win=True)
    reply = client.post("/v1/completions", json={"prompt": "Paris is the capital of France", "max_tokens": 4,
                                                 "temperature": 0, "retrieve": 1, **PHRASES_ON}).json()
    assert [d["id"] for d in reply["dynvocab"]["documents"]] == ["paris"]
    sources = {s["source"]["document"] for s in reply["choices"][0]["segments"] if s["type"] == "phrase"}
    assert sources == {"paris"}
    stages = reply["dynvocab"]["stages"]
    assert list(stages) == ["retrieve", "extract", "encode", "decode"] and all(seconds > 0 for seconds in stages.values())


def test_a_request_s_own_phrases_are_written_whole_without_a_source(make_client):
    client = make_client(phrases_win=True)
    reply = client.post("/v1/completions", json={"prompt": "We saw", "max_tokens": 3, "temperature": 0,
                                                 "phrases": ["the Hudson River"], **PHRASES_ON}).json()
    phrase = reply["choices"][0]["segments"][0]
    assert phrase["type"] == "phrase" and phrase["text"].strip() == "the Hudson River" and phrase["source"] is None


def test_a_stop_string_cuts_the_text_and_ends_the_row(make_client):
    client = make_client()
    free = client.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 10, "temperature": 0}).json()
    text = free["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = client.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 10, "temperature": 0,
                                               "stop": [stop]}).json()["choices"][0]
    assert cut["text"] == text[: text.find(stop)] and cut["finish_reason"] == "stop"
    assert "".join(s["text"] for s in cut["segments"]) == cut["text"]


def test_a_stream_sends_one_chunk_per_step_and_ends_with_done(make_client):
    client = make_client(phrases_win=True)
    request = {"prompt": "The city", "max_tokens": 6, "temperature": 0, "documents": [DOCS[0]["text"]], **PHRASES_ON}
    whole = client.post("/v1/completions", json=request).json()
    streamed = events(client.post("/v1/completions", json=request | {"stream": True,
                                                                     "stream_options": {"include_usage": True}}))
    assert streamed[-1] == "[DONE]"
    usage, last, steps = streamed[-2], streamed[-3], streamed[:-3]
    assert usage["usage"] == whole["usage"] and usage["choices"] == []
    assert last["choices"][0]["finish_reason"] == "length"
    assert len(steps) == whole["usage"]["completion_tokens"]  # a phrase is one chunk
    assert "".join(chunk["choices"][0]["text"] for chunk in steps) == whole["choices"][0]["text"]
    phrase_chunks = [c["choices"][0]["segments"][0] for c in steps if c["choices"][0]["segments"][0]["type"] == "phrase"]
    assert phrase_chunks == [s for s in whole["choices"][0]["segments"] if s["type"] == "phrase"]


def test_a_seeded_sampled_request_returns_the_same_text_each_time(make_client):
    client = make_client()
    request = {"prompt": "The cat sat on", "max_tokens": 12, "temperature": 1.0, "seed": 7}
    texts = {client.post("/v1/completions", json=request).json()["choices"][0]["text"] for _ in range(3)}
    others = {client.post("/v1/completions", json=request | {"seed": seed}).json()["choices"][0]["text"]
              for seed in range(8, 12)}
    assert len(texts) == 1
    assert len(others | texts) > 1  # the seed matters: 5 seeds do not all sample the same 12 tokens


def test_a_request_with_its_own_readback_never_touches_the_model_config(make_client):
    client = make_client()
    model = client.app.state.engine.model
    before = model.dynvocab_config.readback
    other = "vector" if before == "tokens" else "tokens"
    seen, forward = [], model.forward

    def watched(*args, **kwargs):  # the config the model holds at each forward of the request's decoding
        seen.append(model.dynvocab_config.readback)
        return forward(*args, **kwargs)

    model.forward = watched
    reply = client.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 3, "temperature": 0,
                                                 "phrases": ["the cat sat", "New York"], "readback": other})
    assert reply.status_code == 200 and seen and set(seen) == {before}


def test_health_models_and_metrics(make_client):
    client = make_client()
    client.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 3, "temperature": 0})
    client.post("/v1/completions", json={"prompt": "", "max_tokens": 3})
    assert client.get("/health").json() == {"status": "ok", "model": "tiny", "corpora": ["wiki"], "queue": 0}
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    metrics = client.get("/metrics").text
    for line in ('dynvocab_requests_total{outcome="ok"} 1.0', 'dynvocab_errors_total{kind="invalid_prompt"} 1.0',
                 "dynvocab_batch_size_count 2.0", "dynvocab_generated_steps_total 3.0", "dynvocab_queue_length 0.0",
                 'dynvocab_stage_seconds_count{stage="decode"} 1.0'):
        assert line in metrics, line


def test_the_api_key_is_required_when_set(make_client, monkeypatch):
    monkeypatch.setenv("DYNVOCAB_API_KEY", "s3cret")
    client = make_client()
    request = {"prompt": "The cat", "max_tokens": 2}
    refused = client.post("/v1/completions", json=request)
    assert refused.status_code == 401 and "Bearer" in refused.json()["error"]["message"]
    assert client.post("/v1/completions", json=request, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/v1/completions", json=request, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/health").status_code == 200  # probes need no key


def test_a_phrase_one_request_encoded_is_free_for_the_next(make_client):
    client = make_client()
    cache = client.app.state.engine.model.phrase_cache
    paris = {"prompt": "The city", "max_tokens": 2, "temperature": 0, "documents": [DOCS[1]["text"]]}
    client.post("/v1/completions", json=paris)
    client.post("/v1/completions", json=paris | {"documents": [DOCS[2]["text"]]})  # another phrase set in between
    misses = cache.misses
    assert misses > 0 and cache.hits == 0
    client.post("/v1/completions", json=paris | {"prompt": "Another prompt"})
    assert cache.misses == misses and cache.hits > 0  # Paris's phrases again: every vector came from the cache
