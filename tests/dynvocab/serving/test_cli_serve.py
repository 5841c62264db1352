"""``dynvocab serve`` end to end: one command starts it and prints the address; SIGTERM lets the request in flight
finish before the process exits."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from dynvocab.cli import build_parser
from dynvocab.serving import ServerConfig


def start_serve(tiny_lm_dir, *flags: str) -> tuple[subprocess.Popen, str]:
    """``dynvocab serve`` on the tiny LM, no index, a free port, plus ``flags``: the process and its first stdout line."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "DYNVOCAB_API_KEY": ""}
    server = subprocess.Popen([sys.executable, "-m", "dynvocab", "serve", "--model", str(tiny_lm_dir), "--index", "none",
                               "--port", "0", *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env)
    return server, server.stdout.readline()


def test_the_serve_flags_fill_the_server_config():
    args = build_parser().parse_args(["serve", "--index", "none", "--port", "0", "--max-batch-size", "4",
                                      "--batch-wait-ms", "5", "--max-queue", "3", "--max-tokens-limit", "9",
                                      "--api-key", "k"])
    config = ServerConfig(**{name: getattr(args, name) for name in ServerConfig.__dataclass_fields__})
    assert (config.index, config.port, config.max_batch_size, config.batch_wait_ms, config.max_queue,
            config.max_tokens_limit, config.api_key, config.host) == ("none", 0, 4, 5.0, 3, 9, "k", "127.0.0.1")


def test_serve_prints_its_address_and_finishes_the_request_in_flight_on_sigterm(tiny_lm_dir):
    server, line = start_serve(tiny_lm_dir, "--max-tokens-limit", "400")
    try:
        assert line.startswith("dynvocab serve: ") and " on http://127.0.0.1:" in line, line
        url = line.split(" on ")[1].split()[0]
        request = {"prompt": "The cat", "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.Client(timeout=120) as client, client.stream("POST", f"{url}/v1/completions", json=request) as reply:
            lines = reply.iter_lines()
            assert next(lines).startswith("data: ")
            server.send_signal(signal.SIGTERM)  # mid-stream: the server stops taking requests, this one goes on
            data = [line[6:] for line in lines if line.startswith("data: ")]
        assert data[-1] == "[DONE]"
        assert json.loads(data[-2])["choices"][0]["finish_reason"] == "length"
        assert len(data) - 2 == 200 - 1  # every step after the first came, then the final chunk
        assert server.wait(timeout=60) == -signal.SIGTERM  # uvicorn re-raises the signal once it has shut down
    finally:
        server.kill()


def test_a_request_still_running_at_the_shutdown_timeout_fails_cleanly(tiny_lm_dir):
    server, line = start_serve(tiny_lm_dir, "--max-tokens-limit", "100000", "--shutdown-timeout", "1")
    try:
        url = line.split(" on ")[1].split()[0]
        request = {"prompt": "The cat", "max_tokens": 100_000, "temperature": 0, "stream": True}
        with httpx.Client(timeout=120) as client, client.stream("POST", f"{url}/v1/completions", json=request) as reply:
            lines = reply.iter_lines()
            assert next(lines).startswith("data: ")
            stopped_at = time.monotonic()
            server.send_signal(signal.SIGTERM)
            data = [line[6:] for line in lines if line.startswith("data: ")]
        assert data[-1] == "[DONE]"
        error = json.loads(data[-2])["error"]
        assert error["code"] == "shutting_down" and "--shutdown-timeout" in error["message"]
        assert time.monotonic() - stopped_at < 30  # failed after the 1 s timeout, not after 100,000 steps
        server.wait(timeout=60)
    finally:
        server.kill()


@pytest.mark.slow
def test_two_workers_share_the_port_and_both_answer(tiny_lm_dir):
    server, line = start_serve(tiny_lm_dir, "--workers", "2")
    try:
        assert "2 worker(s)" in line, line
        url = line.split(" on ")[1].split()[0]
        with httpx.Client(timeout=120) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # both workers load their own model
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)

        async def burst() -> set[str]:
            async with httpx.AsyncClient(timeout=120) as client:
                replies = await asyncio.gather(*(client.post(f"{url}/v1/completions", json={
                    "prompt": "The cat", "max_tokens": 30, "temperature": 0}) for _ in range(32)))
            assert {reply.status_code for reply in replies} == {200}
            assert len({reply.json()["choices"][0]["text"] for reply in replies}) == 1  # same weights in both
            return {reply.headers["x-served-by"] for reply in replies}

        served_by = set()
        for _ in range(5):  # the kernel hands connections to whichever worker accepts first
            served_by |= asyncio.run(burst())
            if len(served_by) == 2:
                break
        assert len(served_by) == 2
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    finally:
        server.kill()
