"""``dynvocab serve``: load the model and its corpus, then run the application under uvicorn."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

try:
    import uvicorn

    from .app import create_app
except ImportError as error:
    if error.name not in ("uvicorn", "fastapi", "starlette", "prometheus_client"):
        raise
    raise ImportError(f"dynvocab serve needs the [serve] extra ({error.name} is missing): "
                      "pip install 'dynvocab[serve]'") from error

from retrieval.phrase_vectors import attach_phrase_vectors

from ...loading import SHIPPED_ENCODER, freeze_loaded_objects, load_dynamic_lm
from ..config import API_KEY_ENV, ServerConfig
from ..engine.engine import Engine
from ..engine.scheduler import Batcher
from .logs import JsonFormatter

logger = logging.getLogger(__name__)

#: how ``serve`` hands its settings to worker processes (the API key goes through ``API_KEY_ENV``, not here)
CONFIG_ENV = "DYNVOCAB_SERVE_CONFIG"


def load_engine(config: ServerConfig) -> Engine:
    """The model (with the shipped encoder for 'smollm2' unless ``checkpoint`` says otherwise) and the served corpus."""
    checkpoint = config.checkpoint
    if checkpoint is None and config.model == "smollm2" and SHIPPED_ENCODER.exists():
        checkpoint = SHIPPED_ENCODER
    corpora = load_corpora(config)  # first: a wrong index path fails before the model loads
    model = load_dynamic_lm(config.model, checkpoint)
    for index in corpora.values():  # phrase vectors kept beside a served index are read, not encoded per request
        attach_phrase_vectors(model, index)
    engine = Engine(model, corpora, Path(config.model).name, config)
    freeze_loaded_objects()  # no full garbage collection over the loaded stack inside a request
    return engine


def load_corpora(config: ServerConfig) -> dict[str, Any]:
    """``{name: index}``: 'wikipedia' (built once into ``workdir``), a ``dynvocab index`` folder by its name, or none."""
    if config.index == "none":
        return {}
    from retrieval.loading import demo_index, document_encoder

    if config.index == "wikipedia":
        return {"wikipedia": demo_index(Path(config.workdir), encoder=config.encoder)}
    folder = Path(config.index)
    if not (folder / "metadata.json").is_file():
        raise FileNotFoundError(f"--index {config.index!r} is not a folder written by `dynvocab index`; pass such a "
                                "folder, 'wikipedia' or 'none'")
    from retrieval import DocumentIndex

    return {folder.name: DocumentIndex.load(folder, encoder=document_encoder(config.encoder))}


class DrainingServer(uvicorn.Server):
    """On a shutdown signal, first lets the batcher finish its requests within ``--shutdown-timeout`` and cleanly fail
    the rest (a 503; a stream gets it as an error event and ``[DONE]``), then shuts down as uvicorn does."""

    def __init__(self, batcher: Batcher, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.batcher = batcher

    async def shutdown(self, sockets=None) -> None:
        await self.batcher.stop()
        await super().shutdown(sockets)


def app_from_environment():
    """The application of one worker process, from the settings ``serve`` put in ``CONFIG_ENV`` (a uvicorn factory)."""
    logging.basicConfig(level=logging.INFO)  # a worker is a fresh process: log as `dynvocab serve` does
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
    config = ServerConfig(**json.loads(os.environ[CONFIG_ENV]))
    return create_app(load_engine(config), config)


def serve(config: ServerConfig, engine: Engine | None = None) -> None:
    """Bind ``host:port``, print the address, and serve until SIGINT/SIGTERM (requests in flight finish first).

    With ``config.workers > 1`` each worker process loads its own model and they share the bound socket."""
    if config.workers > 1 and engine is not None:
        raise ValueError(f"workers={config.workers} loads one model per process; pass engine=None")
    listener = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((config.host, config.port))
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if config.workers > 1:
        print(f"dynvocab serve: {Path(config.model).name} on http://{shown}:{port} ({config.workers} worker(s), each "
              "loading its model)", flush=True)
        if config.api_key:
            os.environ[API_KEY_ENV] = config.api_key
        os.environ[CONFIG_ENV] = json.dumps(dataclasses.asdict(config) | {"api_key": None})
        # each worker drains at its lifespan's end, which uvicorn reaches after its own graceful wait
        uvicorn.run("dynvocab.serving.http.server:app_from_environment", factory=True, fd=listener.fileno(),
                    workers=config.workers, log_config=None, timeout_graceful_shutdown=config.shutdown_timeout)
        return
    engine = engine or load_engine(config)
    app = create_app(engine, config)
    print(f"dynvocab serve: {engine.model_name} on http://{shown}:{port} (corpora: {sorted(engine.corpora) or 'none'}; "
          "the page at /, POST /v1/completions, GET /v1/models, /metrics, /health)", flush=True)
    # uvicorn's own timeout comes later than the batcher's, so requests fail cleanly before connections are cut
    server = DrainingServer(app.state.batcher, uvicorn.Config(app, log_config=None,
                                                              timeout_graceful_shutdown=config.shutdown_timeout + 5))
    server.run(sockets=[listener])
