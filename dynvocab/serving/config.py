"""``ServerConfig``: what ``dynvocab serve`` loads, where it listens, and the limits it keeps (no FastAPI import here,
so the command line can list these flags without the ``[serve]`` extra)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..config import check_at_least, check_field_types
from ..data.assets import DEFAULT_RETRIEVER, ENCODER_HELP

#: where ``--api-key`` is read from when the flag is not given
API_KEY_ENV = "DYNVOCAB_API_KEY"


@dataclass
class ServerConfig:
    """Settings of one ``dynvocab serve`` process."""

    model: str = field(default="smollm2", metadata={"help": "Causal LM name or path ('smollm2' is the offline asset)."})
    checkpoint: str | None = field(
        default=None, metadata={"help": "Phrase-encoder checkpoint folder; default: the shipped SmolLM2 one."}
    )
    index: str = field(
        default="wikipedia",
        metadata={"help": "Corpus served to `retrieve`: 'wikipedia' (the offline leads, indexed once into --workdir), "
                          "a folder written by `dynvocab index`, or 'none'."},
    )
    encoder: str = field(default=DEFAULT_RETRIEVER, metadata={"help": ENCODER_HELP})
    workdir: str = field(default=".cache/demo", metadata={"help": "Where the 'wikipedia' index is cached."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to bind; 0.0.0.0 exposes the server to the network."})
    port: int = field(default=8000, metadata={"help": "TCP port (0: any free port)."})
    max_batch_size: int = field(default=8, metadata={"help": "Requests decoded together (rows of one decoding step) at most."})
    batch_wait_ms: float = field(
        default=10.0, metadata={"help": "How long the first request of an idle server waits for others to prefill with "
                                        "it (its phrases are prepared meanwhile); later ones join at the next step."}
    )
    max_queue: int = field(default=64, metadata={"help": "Requests waiting at most; more are refused with 503 + Retry-After."})
    max_tokens_limit: int = field(default=512, metadata={"help": "Largest max_tokens a request may ask for."})
    max_prompt_tokens: int = field(default=2048, metadata={"help": "Longest prompt, in LM tokens."})
    max_phrases: int = field(default=4096, metadata={"help": "Phrases a request may send at most."})
    max_documents: int = field(default=64, metadata={"help": "Documents a request may send or retrieve at most."})
    max_body_bytes: int = field(default=1_048_576, metadata={"help": "Largest request body, in bytes."})
    api_key: str | None = field(
        default=None, metadata={"help": f"Bearer token every request must carry (default: ${API_KEY_ENV}; none: open)."}
    )
    workers: int = field(
        default=1, metadata={"help": "Server processes sharing the port, each with its own copy of the model (uvicorn "
                                     "workers): the scale-out on one machine."})
    shutdown_timeout: float = field(
        default=30.0, metadata={"help": "Seconds a shutdown waits for requests in flight before failing them."}
    )

    def __post_init__(self) -> None:
        check_field_types(self)
        check_at_least(self, 1, ("workers", "max_batch_size", "max_queue", "max_tokens_limit", "max_prompt_tokens",
                                 "max_documents", "max_body_bytes"))
        check_at_least(self, 0, ("port", "max_phrases"))
        if self.batch_wait_ms < 0 or self.shutdown_timeout < 0:
            raise ValueError(f"batch_wait_ms={self.batch_wait_ms} and shutdown_timeout={self.shutdown_timeout} must be "
                             ">= 0; pass 0 to not wait")
        if self.port > 65535:
            raise ValueError(f"port={self.port} is not a TCP port; pass 1..65535, or 0 for any free port")
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or None
