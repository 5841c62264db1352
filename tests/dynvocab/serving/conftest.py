"""Serving fixtures: a tiny random Llama behind the server, a small word-hashed corpus, a test client."""

from __future__ import annotations

import copy

import pytest
from fastapi.testclient import TestClient

from dynvocab import DynamicVocabLM
from dynvocab.serving import ServerConfig
from dynvocab.serving.engine.engine import Engine
from dynvocab.serving.http.app import create_app
from retrieval import DocumentIndex
from tests.helpers import HashEncoder, PreferPhrases

from .documents import DOCS


@pytest.fixture(scope="session")
def _tiny_model(_base_models, _gpt2_tokenizer):
    return DynamicVocabLM.from_causal_lm(copy.deepcopy(_base_models["llama"]), copy.deepcopy(_gpt2_tokenizer)).eval()


@pytest.fixture(scope="session")
def _corpus():
    return {"wiki": DocumentIndex.build(DOCS, HashEncoder(), index_type="flat")}


def _engine_factory(model: DynamicVocabLM, corpora: dict):
    def make(phrases_win: bool = False, **settings) -> Engine:
        copied = copy.deepcopy(model)
        if phrases_win:
            copied.scorer = PreferPhrases()
        return Engine(copied, corpora, "tiny", ServerConfig(index="none", **settings))

    return make


@pytest.fixture
def make_engine(_tiny_model, _corpus):
    """``make_engine(phrases_win=False, **ServerConfig fields)``: a fresh copy of the tiny model behind an ``Engine``."""
    return _engine_factory(_tiny_model, _corpus)


def _client_factory(make_engine):
    """``make(phrases_win=False, **settings)`` opening ``TestClient`` s (their lifespan, the batcher, running), and
    the function that closes them all."""
    clients = []

    def make(phrases_win: bool = False, **settings) -> TestClient:
        engine = make_engine(phrases_win, **settings)
        client = TestClient(create_app(engine, engine.config))
        clients.append(client.__enter__())
        return client

    def close() -> None:
        for client in clients:
            client.__exit__(None, None, None)

    return make, close


@pytest.fixture
def make_client(make_engine):
    """``make_client(phrases_win=False, **settings)``: a ``TestClient`` over a fresh app, closed after the test."""
    make, close = _client_factory(make_engine)
    yield make
    close()


@pytest.fixture(scope="module")
def make_module_client(_tiny_model, _corpus):
    """``make_client`` whose clients live for the whole module."""
    make, close = _client_factory(_engine_factory(_tiny_model, _corpus))
    yield make
    close()


@pytest.fixture
def live_server(make_engine):
    """``live_server(**settings)``: the app under a real uvicorn on a free loopback port, in a thread; its base URL."""
    import socket
    import threading
    import time

    import uvicorn

    servers = []

    def start(phrases_win: bool = False, **settings) -> str:
        engine = make_engine(phrases_win, **settings)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(create_app(engine, engine.config), log_config=None))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.started, "uvicorn did not start within 30 s"
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=30)
