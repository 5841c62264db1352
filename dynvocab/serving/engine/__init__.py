"""The serving engine, below the HTTP adapter: check a request, queue it, and decode requests together in one running
batch, each row with its own phrase set (no web stack here)."""

from .engine import Completion, Engine, Job
from .errors import ApiError, invalid
from .requests import CompletionRequest, Document
from .rows import Row
from .running_batch import RunningBatch
from .scheduler import Batcher, EngineObserver

__all__ = [
    "ApiError",
    "Batcher",
    "Completion",
    "CompletionRequest",
    "Document",
    "Engine",
    "EngineObserver",
    "Job",
    "Row",
    "RunningBatch",
    "invalid",
]
