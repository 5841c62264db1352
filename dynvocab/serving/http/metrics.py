"""Prometheus metrics of one server, in a registry of its own (two apps in one process never share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """Requests by outcome, errors by kind, the queue, batch sizes, tokens and phrase steps, stage and request times."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("dynvocab_requests", "Completion requests by outcome (ok, cancelled, error).",
                                ["outcome"], registry=registry)
        self.errors = Counter("dynvocab_errors", "Refused or failed requests by error code.", ["kind"], registry=registry)
        self.queue_length = Gauge("dynvocab_queue_length", "Requests waiting for a row of the running batch.",
                                  registry=registry)
        self.batch_size = Histogram("dynvocab_batch_size", "Rows decoded together, one observation per decoding step.",
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64), registry=registry)
        self.tokens = Counter("dynvocab_generated_steps", "Decoding steps written (a phrase is one step).",
                              registry=registry)
        self.phrase_steps = Counter("dynvocab_phrase_steps", "Decoding steps that wrote a phrase.", registry=registry)
        self.steps_per_second = Gauge("dynvocab_steps_per_second", "Steps written per second by the last decoding "
                                      "step (its rows over its seconds).", registry=registry)
        self.phrase_steps_per_second = Gauge("dynvocab_phrase_steps_per_second",
                                             "Phrases written per second by the last decoding step.", registry=registry)
        self.stage_seconds = Histogram("dynvocab_stage_seconds", "Seconds of each stage, per request of a batch.",
                                       ["stage"], buckets=SECONDS, registry=registry)
        self.request_seconds = Histogram("dynvocab_request_seconds", "Seconds from arrival to the last byte.",
                                         buckets=SECONDS, registry=registry)
        self.first_step_seconds = Histogram("dynvocab_time_to_first_step_seconds",
                                            "Seconds from arrival to the first streamed step.", buckets=SECONDS,
                                            registry=registry)

    def observe_queue(self, waiting: int) -> None:
        """``waiting`` requests wait for a row."""
        self.queue_length.set(waiting)

    def observe_step(self, rows: int, phrases: int, seconds: float) -> None:
        """A decoding step of ``rows`` rows, ``phrases`` of which wrote a phrase, that took ``seconds``."""
        self.batch_size.observe(rows)
        if seconds > 0:
            self.steps_per_second.set(rows / seconds)
            self.phrase_steps_per_second.set(phrases / seconds)

    def observe_completion(self, completion) -> None:
        """A finished request: its steps, phrase steps and stage times."""
        self.tokens.inc(completion.completion_tokens)
        self.phrase_steps.inc(completion.phrase_steps)
        for stage, value in completion.stages.items():
            self.stage_seconds.labels(stage).observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
