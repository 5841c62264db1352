"""Structured logs: each request's lines carry its id, and the formatter writes them as one JSON object a line."""

import json
import logging

from dynvocab.serving.http.logs import JsonFormatter


def test_a_request_logs_its_id_and_outcome(make_client, caplog):
    client = make_client()
    with caplog.at_level(logging.INFO, logger="dynvocab.serving"):
        reply = client.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 3, "temperature": 0})
        refused = client.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 0})
    done = [r for r in caplog.records if getattr(r, "request_id", None) == reply.json()["id"]]
    assert [(r.message, r.finish_reason, r.completion_tokens) for r in done] == [("completion done", "length", 3)]
    refusal = next(r for r in caplog.records if r.message == "refused")
    assert refusal.status == 400 and refusal.code == "invalid_max_tokens" and refusal.request_id.startswith("cmpl-")
    assert refused.status_code == 400


def test_the_formatter_writes_one_json_object_with_the_extra_fields():
    record = logging.LogRecord("dynvocab.serving.http.app", logging.INFO, __file__, 1, "completion %s", ("done",), None)
    record.request_id, record.seconds = "cmpl-1", 0.5
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "completion done" and entry["request_id"] == "cmpl-1" and entry["seconds"] == 0.5
    assert entry["level"] == "INFO" and entry["logger"] == "dynvocab.serving.http.app"
