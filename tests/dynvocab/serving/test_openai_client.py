"""The official ``openai`` client against a live uvicorn server on a loopback port, and a client that leaves."""

import json
import time

import httpx
import openai

from .documents import DOCS

EXTRA = {"documents": [DOCS[0]["text"]], "agreement_top_k": 0, "grounded": False}


def test_the_openai_client_round_trip(live_server):
    url = live_server(phrases_win=True)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    whole = client.completions.create(model="tiny", prompt="The city", max_tokens=6, temperature=0, extra_body=EXTRA)
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 6
    segments = choice.model_extra["segments"]
    assert any(s["type"] == "phrase" and s["source"]["document"] == "0" for s in segments)
    assert "".join(s["text"] for s in segments) == choice.text

    stream = client.completions.create(model="tiny", prompt="The city", max_tokens=6, temperature=0, stream=True,
                                       extra_body=EXTRA)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert [c.choices[0].model_extra["segments"][0] for c in chunks[:-1]
            if c.choices[0].model_extra["segments"][0]["type"] == "phrase"] == [s for s in segments
                                                                                 if s["type"] == "phrase"]


def test_the_openai_client_gets_a_typed_error_and_the_key_is_checked(live_server, monkeypatch):
    monkeypatch.setenv("DYNVOCAB_API_KEY", "k3y")
    url = live_server()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="k3y", max_retries=0)
    try:
        client.completions.create(model="tiny", prompt="x", max_tokens=0)
        raise AssertionError("max_tokens=0 was accepted")
    except openai.BadRequestError as error:
        assert error.code == "invalid_max_tokens" and "max_tokens=0" in error.message
    try:
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError as error:
        assert error.status_code == 401


def test_a_client_that_disconnects_stops_its_generation(live_server):
    url = live_server(max_tokens_limit=100_000)
    request = {"prompt": "The cat", "max_tokens": 100_000, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{url}/v1/completions", json=request) as reply:
            lines = reply.iter_lines()
            received = [line for line, _ in zip(lines, range(6)) if line.startswith("data: ")]
        # leaving the block closes the connection mid-stream
        assert len(received) == 3 and json.loads(received[0][6:])["choices"][0]["finish_reason"] is None
        deadline, metrics = time.monotonic() + 30, ""
        while 'dynvocab_requests_total{outcome="cancelled"} 1.0' not in metrics and time.monotonic() < deadline:
            time.sleep(0.05)
            metrics = client.get(f"{url}/metrics").text
        assert 'dynvocab_requests_total{outcome="cancelled"} 1.0' in metrics
        deadline = time.monotonic() + 30  # the batch ends soon after: the decoding thread is free for the next request
        while "dynvocab_batch_size_count 1.0" not in metrics and time.monotonic() < deadline:
            time.sleep(0.05)
            metrics = client.get(f"{url}/metrics").text
        steps = float(next(l for l in metrics.splitlines() if l.startswith("dynvocab_generated_steps_total")).split()[1])
        assert 3 <= steps < 100_000
        follow = client.post(f"{url}/v1/completions", json={"prompt": "The cat", "max_tokens": 2, "temperature": 0})
        assert follow.status_code == 200
