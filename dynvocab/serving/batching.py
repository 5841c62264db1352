"""Batching: requests that arrive within the batch wait, and decode alike, go to one ``generate()`` call.

One worker thread decodes (the model runs one batch at a time); the event loop gathers the next batch meanwhile.
The queue is bounded: a request that finds it full is refused with 503 and ``Retry-After``, never left waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from .config import ServerConfig
from .engine import Engine, Job
from .errors import ApiError
from .metrics import ServerMetrics

logger = logging.getLogger(__name__)


class Batcher:
    """A bounded queue of ``Job`` s and the task that decodes them in batches of one key."""

    def __init__(self, engine: Engine, config: ServerConfig, metrics: ServerMetrics) -> None:
        self.engine, self.config, self.metrics = engine, config, metrics
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="dynvocab-decode")
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.waiting: deque[Job] = deque()  # taken from the queue but of another key: first in line next time
        self.running: list[Job] = []  # the batch being gathered or decoded
        self.closing = False
        self.task: asyncio.Task | None = None

    def __len__(self) -> int:
        """Requests waiting for a batch."""
        return self.queue.qsize() + len(self.waiting)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def submit(self, job: Job) -> None:
        """Queue ``job``; ``ApiError`` 503 with ``Retry-After`` when the queue is full or the server is stopping."""
        if self.closing:
            raise ApiError(503, "the server is shutting down; send the request to another replica or retry later",
                           code="shutting_down", kind="server_error", headers={"Retry-After": "5"})
        if len(self) >= self.config.max_queue:
            raise ApiError(503, f"the queue is full ({self.config.max_queue} requests waiting, the server's --max-queue); "
                           "retry after the Retry-After seconds", code="queue_full", kind="server_error",
                           headers={"Retry-After": "1"})
        self.queue.put_nowait(job)
        self.metrics.queue_length.set(len(self))

    async def stop(self) -> None:
        """Refuse new requests, let queued and running ones finish for ``shutdown_timeout`` s, then fail the rest."""
        self.closing = True
        deadline = time.monotonic() + self.config.shutdown_timeout
        while (len(self) or self.running) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stopped = ApiError(503, f"the server shut down before this request finished (it waits {self.config.shutdown_timeout}"
                           " s, the server's --shutdown-timeout); retry it", code="shutting_down", kind="server_error",
                           headers={"Retry-After": "5"})
        for job in [*self.waiting, *_drain(self.queue), *self.running]:
            job.cancelled.set()  # a running row ends at its next step
            job.on_error(stopped)
        if self.task is not None:
            self.task.cancel()
        self.executor.shutdown(wait=False)

    async def _serve(self) -> None:
        while True:
            self.running = []
            batch = [job for job in await self._next_batch() if not job.cancelled.is_set()]
            self.metrics.queue_length.set(len(self))
            if batch:
                await self._decode(batch)

    async def _next_batch(self) -> list[Job]:
        """The oldest job, and the jobs of its key that are waiting or arrive within ``batch_wait_ms``."""
        first = self.waiting.popleft() if self.waiting else await self.queue.get()
        batch, size = [first], self.config.max_batch_size
        self.running = batch  # gathered jobs count as running: a shutdown waits for them, or fails them
        for job in [job for job in self.waiting if job.key == first.key][: size - 1]:
            self.waiting.remove(job)
            batch.append(job)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.batch_wait_ms / 1e3
        while len(batch) < size and (left := deadline - loop.time()) > 0:
            try:
                job = await asyncio.wait_for(self.queue.get(), left)
            except asyncio.TimeoutError:
                break
            (batch if job.key == first.key else self.waiting).append(job)
        return batch

    async def _decode(self, batch: list[Job]) -> None:
        self.running = batch
        start = time.perf_counter()
        try:
            completions = await asyncio.get_running_loop().run_in_executor(self.executor, self.engine.run, batch)
        except Exception as error:  # a bug, not a request's fault (requests are checked before they queue)
            logger.exception("a batch of %d failed", len(batch), extra={"request_ids": [j.request_id for j in batch]})
            for job in batch:
                job.on_error(ApiError(500, f"decoding failed: {type(error).__name__}: {error}", code="internal_error",
                                      kind="server_error"))
        else:
            self.metrics.observe_batch(completions, time.perf_counter() - start)
        finally:
            self.running = []


def _drain(queue: asyncio.Queue) -> list[Job]:
    jobs = []
    while not queue.empty():
        jobs.append(queue.get_nowait())
    return jobs
