"""The JSON of ``/v1/completions``: OpenAI's fields, the library's own beside them, and the responses."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: the library's fields that choose a phrase set; a request with none of them is the bare LM's
PHRASE_SOURCES = ("phrases", "documents", "retrieve")

#: the library's settings that go to ``retrieval.pipeline.PipelineConfig`` as they are
PIPELINE_SETTINGS = (
    "unit", "min_length", "max_length", "min_count", "max_phrases", "edges", "ranking", "no_repeat_ngram_size",
    "repetition_penalty", "agreement_top_k", "phrase_max_uses", "first_token_mass", "phrase_bias", "context_tokens",
    "state_threshold", "verify_top_k", "draft_tokens", "gamma", "relax_after", "read_documents", "read_tokens",
    "cite_tokens", "document_kv", "fill_tokens",
)


class Document(BaseModel):
    """A document to cut phrases from; its ``id`` names it in the response's segments (default: its position)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: str
    title: str | None = None
    id: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """``POST /v1/completions``: OpenAI's completion fields plus the phrase fields; unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # OpenAI's fields (OpenAI's defaults: temperature 1 samples; 0 is greedy)
    prompt: str
    model: str | None = None
    max_tokens: int = 16
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: str | None = None
    # the library's fields: where the phrases come from
    phrases: list[str] | None = None
    documents: list[str | Document] | None = None
    retrieve: int | None = Field(None, ge=1)
    corpus: str | None = None
    readback: Literal["tokens", "vector"] | None = None
    # phrase rules and extraction (None: the PipelineConfig default; no_repeat_ngram_size defaults to 0, the bare LM's)
    no_repeat_ngram_size: int = Field(0, ge=0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    agreement_top_k: int | None = Field(None, ge=0)
    phrase_max_uses: int | None = Field(None, ge=0)
    context_tokens: int | None = Field(None, ge=0)
    state_threshold: float | None = Field(None, ge=-1.0, le=1.0)
    # grounded decoding (default with documents; batched with requests of the same gamma): the LM reads the top
    # documents and writes every token, phrases and drafts propose, copied spans cite their documents
    grounded: bool | None = None
    gamma: float | None = Field(None, gt=0.0, le=1.0)
    relax_after: int | None = Field(None, ge=0)
    read_documents: int | None = Field(None, ge=0)
    read_tokens: int | None = Field(None, ge=0)
    cite_tokens: int | None = Field(None, ge=1)
    document_kv: int | None = Field(None, ge=0)
    fill_tokens: int | None = Field(None, ge=0)
    # verified decoding (batched with requests of the same rule): phrases kept as far as the LM agrees, drafts from
    # documents
    verify_top_k: int | None = Field(None, ge=0)
    draft_tokens: int | None = Field(None, ge=0)
    first_token_mass: bool | None = None
    phrase_bias: float | None = None
    unit: Literal["tokens", "words"] | None = None
    min_length: int | None = Field(None, ge=1)
    max_length: int | None = Field(None, ge=1)
    min_count: int | None = Field(None, ge=1)
    max_phrases: int | None = Field(None, ge=0)
    edges: Literal["content", "any"] | None = None
    ranking: Literal["relevance", "frequency"] | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def stops(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def uses_phrases(self) -> bool:
        return any(getattr(self, name) for name in PHRASE_SOURCES)
