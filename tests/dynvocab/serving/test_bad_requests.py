"""Bad requests get a 4xx OpenAI-style error naming the field, the value, the rule and the fix; never a 500 or a hang."""

import json

import pytest

LIMITS = {"max_tokens_limit": 64, "max_body_bytes": 4096, "max_phrases": 5, "max_documents": 3, "max_prompt_tokens": 50}
OK = {"prompt": "The cat sat", "max_tokens": 2}

# (name, body: a dict sent as JSON or raw bytes, status, a phrase the error message must contain)
ROWS = [
    ("max_tokens a string", OK | {"max_tokens": "5"}, 400, "max_tokens='5' is refused: input should be a valid integer"),
    ("max_tokens a float", OK | {"max_tokens": 5.0}, 400, "max_tokens=5.0"),
    ("temperature a string", OK | {"temperature": "hot"}, 400, "temperature='hot'"),
    ("prompt a list", OK | {"prompt": ["a", "b"]}, 400, "input should be a valid string"),
    ("stream not a bool", OK | {"stream": "yes"}, 400, "stream='yes'"),
    ("phrases a string", OK | {"phrases": "New York"}, 400, "phrases='New York' is refused: input should be a valid list"),
    ("phrases of numbers", OK | {"phrases": ["New York", 3]}, 400, "phrases.1=3"),
    ("document without text", OK | {"documents": [{"title": "x"}]}, 400, "'documents.0.text' is required"),
    ("document with a stray key", OK | {"documents": [{"text": "a b", "url": "x"}]}, 400,
     "'documents.0.url' is an unknown field"),
    ("unknown field", OK | {"frobnicate": 1}, 400, "'frobnicate' is an unknown field"),
    ("unsupported OpenAI field", OK | {"logprobs": 5}, 400, "'logprobs' is an unknown field"),
    ("missing prompt", {"max_tokens": 2}, 400, "'prompt' is required"),
    ("max_tokens zero", OK | {"max_tokens": 0}, 400, "max_tokens=0 is refused: it must be 1..64"),
    ("max_tokens negative", OK | {"max_tokens": -3}, 400, "max_tokens=-3 is refused: it must be 1..64"),
    ("max_tokens above the limit", OK | {"max_tokens": 65}, 400, "send max_tokens between 1 and 64"),
    ("temperature negative", OK | {"temperature": -1}, 400, "greater than or equal to 0"),
    ("top_p zero", OK | {"top_p": 0}, 400, "top_p=0"),
    ("n above 1", OK | {"n": 2}, 400, "n=2"),
    ("empty prompt", OK | {"prompt": ""}, 400, "the prompt is empty"),
    ("blank prompt", OK | {"prompt": " \n "}, 400, "the prompt is empty"),
    ("prompt too long", OK | {"prompt": "the cat " * 40}, 400, "more than this server's 50"),
    ("non-UTF-8 body", b'{"prompt": "caf\xe9"}', 400, "is not UTF-8"),
    ("truncated JSON", b'{"prompt": "The cat", "max_tok', 400, "it is not valid JSON"),
    ("empty body", b"", 400, "it is not valid JSON"),
    ("JSON array", b"[1, 2]", 400, "the body must be a JSON object"),
    ("NaN", b'{"prompt": "The cat", "temperature": NaN}', 400, "NaN is not a number JSON allows"),
    ("oversized body", OK | {"prompt": "word " * 1000}, 413, "at most 4096 bytes"),
    ("phrase with a special token", OK | {"phrases": ["New York <|endoftext|>"]}, 400,
     "contains the special token '<|endoftext|>'"),
    ("blank phrase", OK | {"phrases": ["   "]}, 400, "only whitespace"),
    ("too many phrases", OK | {"phrases": [f"phrase number {i}" for i in range(6)]}, 400, "at most 5 phrases"),
    ("too many documents", OK | {"documents": ["a b c"] * 2, "retrieve": 2}, 400, "at most 3 documents"),
    ("retrieve zero", OK | {"retrieve": 0}, 400, "retrieve=0"),
    ("corpus not served", OK | {"retrieve": 1, "corpus": "enwiki"}, 400, "started with the corpora ['wiki'] only"),
    ("corpus a path", OK | {"retrieve": 1, "corpus": "/etc/passwd"}, 400, "never a path"),
    ("another model", OK | {"model": "gpt-4"}, 404, "this server serves 'tiny' only"),
    ("five stop strings", OK | {"stop": list("abcde")}, 400, "up to 4 stop strings"),
    ("empty stop string", OK | {"stop": ""}, 400, "up to 4 stop strings, none empty"),
    ("phrase lengths crossed", OK | {"documents": ["a b"], "min_length": 5, "max_length": 2}, 400,
     "min_length=5 > max_length=2"),
    ("unknown readback", OK | {"readback": "bytes"}, 400, "readback='bytes'"),
    ("unknown unit", OK | {"unit": "chars"}, 400, "input should be 'tokens' or 'words'"),
    ("state gate without documents", OK | {"phrases": ["New York"], "state_threshold": 0.9}, 400,
     "send documents or retrieve with it, or leave state_threshold out"),
    ("state gate above a cosine", OK | {"documents": ["a b"], "state_threshold": 1.5}, 400, "state_threshold=1.5"),
]


# (name, body, what the response's "dynvocab" part must say): inputs served, with what was left out said in the reply
NOTED_ROWS = [
    ("one-token phrases", OK | {"phrases": ["cat", " Augustus", "New York"]},
     {"skipped_phrases": ["cat", " Augustus"], "num_phrases": 2}),  # "New York" and its mid-sentence " New York"
]


@pytest.fixture(scope="module")
def client(make_module_client):
    """One server for the whole table: a bad request must leave it serving the next."""
    return make_module_client(**LIMITS)


@pytest.mark.parametrize("body, status, phrase", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_a_bad_request_gets_an_openai_error_naming_the_problem(client, body, status, phrase):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = client.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert phrase in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] and "; " in error["message"]  # rule; fix
    assert client.post("/v1/completions", json=OK).status_code == 200  # the server goes on serving


@pytest.mark.parametrize("body, noted", [row[1:] for row in NOTED_ROWS], ids=[row[0] for row in NOTED_ROWS])
def test_a_request_is_served_and_told_what_was_left_out(client, body, noted):
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    details = reply.json()["dynvocab"]
    assert [entry["phrase"] for entry in details["skipped_phrases"]] == noted["skipped_phrases"]
    assert all("single token" in entry["reason"] for entry in details["skipped_phrases"])
    assert details["num_phrases"] == noted["num_phrases"]


def test_a_chunked_body_is_cut_off_at_the_limit(client):
    reply = client.post("/v1/completions", content=iter([b'{"prompt": "', b"x" * 5000, b'"}']))
    assert reply.status_code == 413 and "at most 4096 bytes" in reply.json()["error"]["message"]


@pytest.mark.parametrize("method, path, status", [("GET", "/v1/completions", 405), ("POST", "/v1/chat", 404)])
def test_a_wrong_route_gets_an_openai_error(client, method, path, status):
    reply = client.request(method, path)
    assert reply.status_code == status and "POST /v1/completions" in reply.json()["error"]["message"]


def test_a_bug_is_a_500_in_openai_shape_with_the_request_id(make_client):
    client = make_client()
    client.app.state.engine.check = lambda request: 1 / 0  # a bug in the server, not in the request
    reply = without_raising(client).post("/v1/completions", json=OK)
    error = reply.json()["error"]
    assert reply.status_code == 500 and error["code"] == "internal_error" and "ZeroDivisionError" in error["message"]
    assert "cmpl-" in error["message"]


def without_raising(client):
    """The same app through a client that returns server errors instead of raising them."""
    from fastapi.testclient import TestClient

    return TestClient(client.app, raise_server_exceptions=False)
