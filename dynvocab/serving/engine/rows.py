"""Each row of a served batch: its own token limit, stop strings and cancellation, and its text as it grows.

The running batch hands each row its id after every step; the row passes its new text to its listener (one
call per step: a phrase arrives whole) and says when it is done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: a row's listener: ``(new text, the phrase's table index or None)`` after each step that wrote something
StepListener = Callable[[str, "int | None"], None]


@dataclass
class Row:
    """One request's continuation: new ids, the text a client may see so far, and why it ended."""

    max_tokens: int
    stops: Sequence[str]
    listener: StepListener
    cancelled: threading.Event
    ids: list[int] = field(default_factory=list)
    text: str = ""  # visible text: cut at a stop string
    sent: int = 0  # characters handed to the listener
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def step(self, token: int, decode: Callable[[list[int]], str], eos: set[int], vocab_size: int) -> None:
        """Take one decoded id: update the text, end the row on end-of-text, a stop string or its limit."""
        if self.cancelled.is_set():
            self.finish_reason = "cancelled"
            return
        self.ids.append(token)
        if token in eos:
            self.finish_reason = "stop"
            return
        full = decode(self.ids)
        cut = min((i for i in (full.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            full, self.finish_reason = full[:cut], "stop"
        elif len(self.ids) >= self.max_tokens:
            self.finish_reason = "length"
        self.text = full
        shown = len(full) if self.done else len(full) - self._held_back(full)
        if shown > self.sent or token >= vocab_size:
            self.listener(full[self.sent : shown], token - vocab_size if token >= vocab_size else None)
            self.sent = max(self.sent, shown)

    def _held_back(self, full: str) -> int:
        """Characters kept back until the next step: a half-decoded character, or a start of a stop string."""
        held = len(full) - len(full.rstrip("\ufffd"))
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(full)), 0, -1):
                if full.endswith(stop[:length]):
                    held = max(held, length)
                    break
        return held
