"""Scheduling: one worker thread decodes every request in flight together; a request that arrives while others are
decoding joins them at the next step (``Engine.decode``), one that finishes leaves at once.

Requests decode together only when their keys match (the same decoding settings); the others wait, oldest first,
until the running batch has drained. The queue is bounded: a request that finds it full is refused with 503 and
``Retry-After``, never left waiting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from ..config import ServerConfig
from .engine import Completion, Engine, Job
from .errors import ApiError

logger = logging.getLogger(__name__)


class EngineObserver(Protocol):
    """What the scheduler reports as it works (the HTTP adapter's Prometheus metrics implement it)."""

    def observe_queue(self, waiting: int) -> None:
        """``waiting`` requests wait for a row."""

    def observe_step(self, rows: int, phrases: int, seconds: float) -> None:
        """A decoding step of ``rows`` rows, ``phrases`` of which wrote a phrase, took ``seconds``."""

    def observe_completion(self, completion: Completion) -> None:
        """A request finished."""


class Batcher:
    """A bounded queue of ``Job`` s and the worker that decodes them (one thread: the model runs one step at a time)."""

    def __init__(self, engine: Engine, config: ServerConfig, observer: EngineObserver) -> None:
        self.engine, self.config, self.observer = engine, config, observer
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="dynvocab-decode")
        self.lock = threading.Lock()  # guards waiting, running and busy: the event loop and the worker share them
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []  # jobs the worker took and has not finished
        self.busy = False  # the worker is decoding (or about to)
        self.started = self.closing = False

    def __len__(self) -> int:
        """Requests waiting for a row."""
        return len(self.waiting)

    def start(self) -> None:
        self.started = True

    def submit(self, job: Job) -> None:
        """Queue ``job``; ``ApiError`` 503 with ``Retry-After`` when the queue is full or the server is stopping."""
        if self.closing:
            raise ApiError(503, "the server is shutting down; send the request to another replica or retry later",
                           code="shutting_down", kind="server_error", headers={"Retry-After": "5"})
        with self.lock:
            if len(self.waiting) >= self.config.max_queue:
                raise ApiError(503, f"the queue is full ({self.config.max_queue} requests waiting, the server's "
                               "--max-queue); retry after the Retry-After seconds", code="queue_full",
                               kind="server_error", headers={"Retry-After": "1"})
            self.waiting.append(job)
            wake = self.started and not self.busy
            self.busy = self.busy or wake
        self.observer.observe_queue(len(self))
        if wake:
            self.executor.submit(self._decode)

    async def stop(self) -> None:
        """Refuse new requests, let queued and running ones finish for ``shutdown_timeout`` s, then fail the rest."""
        self.closing = True
        deadline = time.monotonic() + self.config.shutdown_timeout
        while (len(self) or self.running) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stopped = ApiError(503, f"the server shut down before this request finished (it waits {self.config.shutdown_timeout}"
                           " s, the server's --shutdown-timeout); retry it", code="shutting_down", kind="server_error",
                           headers={"Retry-After": "5"})
        with self.lock:
            left, self.waiting, self.running = [*self.waiting, *self.running], deque(), []
        for job in left:
            job.cancelled.set()  # a running row ends at its next step
            job.on_error(stopped)
        self.executor.shutdown(wait=False)

    def _decode(self) -> None:
        """The worker: decode until no request is left; the first of an idle server waits ``batch_wait_ms`` for others
        that arrive together (its phrases are prepared meanwhile)."""
        try:
            self.engine.decode(self._take, self._finished, self._stepped, wait=self.config.batch_wait_ms / 1e3)
        except Exception as error:  # a bug, not a request's fault (requests are checked before they queue)
            with self.lock:
                failed, self.running = self.running, []
            logger.exception("decoding failed", extra={"request_ids": [j.request_id for j in failed]})
            for job in failed:
                job.on_error(ApiError(500, f"decoding failed: {type(error).__name__}: {error}", code="internal_error",
                                      kind="server_error"))
            with self.lock:  # the requests still waiting get a fresh start
                self.busy = bool(self.waiting)
            if self.busy:
                self.executor.submit(self._decode)

    def _take(self, key: tuple | None, room: int) -> list[Job]:
        """Up to ``room`` waiting jobs of ``key`` (None: the oldest job's key), oldest first; when nothing is running
        and none waits, the worker stops (under the lock, so a job queued meanwhile wakes a new one)."""
        with self.lock:
            self.waiting = deque(job for job in self.waiting if not job.cancelled.is_set())
            if key is None and self.waiting:
                key = self.waiting[0].key
            taken = [job for job in self.waiting if job.key == key][:room]
            for job in taken:
                self.waiting.remove(job)
            self.running += taken
            if not taken and not self.running:
                self.busy = False
        self.observer.observe_queue(len(self))
        return taken

    def _finished(self, job: Job, completion: Completion) -> None:
        with self.lock:
            if job in self.running:
                self.running.remove(job)
        self.observer.observe_completion(completion)

    def _stepped(self, rows: int, phrases: int, seconds: float) -> None:
        self.observer.observe_step(rows, phrases, seconds)


