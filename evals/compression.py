"""How much text each decoding step produces: the compression a phrase vocabulary buys.

A *step* is one forward pass of the LM that emits one unit: a token or a whole phrase.
All ratios are pooled over sequences (sum of numerators / sum of denominators), so long
sequences weigh more, as in a throughput figure; ``steps_per_sequence`` is a plain mean.

* ``bytes_per_step``: UTF-8 bytes of the generated text per step.
* ``tokens_per_step``: tokens the *base* tokenizer needs for the same text, per step
  (1.0 for a token-level model whose output re-tokenises identically; > 1 means phrases saved steps).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompressionResult:
    """Pooled per-step ratios; ``tokens_per_step`` and ``base_tokens`` are nan/-1 without a base tokenizer."""

    num_sequences: int
    total_steps: int
    total_bytes: int
    steps_per_sequence: float
    bytes_per_step: float
    base_tokens: int = -1
    tokens_per_step: float = float("nan")


def _count_tokens(tokenizer, text: str) -> int:
    from transformers import PreTrainedTokenizerBase

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not callable(tokenizer):
        kind = type(tokenizer).__name__
        raise TypeError(f"base_tokenizer must be a Hugging Face tokenizer or a callable returning tokens, got {kind}")
    return len(tokenizer(text))


def compression(
    texts: Sequence[str],
    steps: Sequence[int],
    *,
    base_tokenizer: Callable[[str], Sequence[object]] | object | None = None,
) -> CompressionResult:
    """Compression of ``texts`` generated in ``steps[i]`` decoding steps each.

    ``base_tokenizer`` is a Hugging Face tokenizer (counted with ``add_special_tokens=False``)
    or any callable returning a list of tokens.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a list of str, got a single str; wrap it in a list: [text]")
    if len(texts) != len(steps):
        raise ValueError(f"texts has {len(texts)} items but steps has {len(steps)}; pass one step count per text")
    if any(int(s) != s or s < 0 for s in steps):
        raise ValueError(f"steps must be non-negative integers, got {list(steps)}")
    total_steps = int(sum(steps))
    if total_steps == 0:
        raise ValueError("no decoding steps in total; nothing was generated")
    total_bytes = sum(len(text.encode("utf-8")) for text in texts)
    base_tokens, tokens_per_step = -1, float("nan")
    if base_tokenizer is not None:
        base_tokens = sum(_count_tokens(base_tokenizer, text) for text in texts)
        tokens_per_step = base_tokens / total_steps
    return CompressionResult(
        num_sequences=len(texts),
        total_steps=total_steps,
        total_bytes=total_bytes,
        steps_per_sequence=total_steps / len(texts),
        bytes_per_step=total_bytes / total_steps,
        base_tokens=base_tokens,
        tokens_per_step=tokens_per_step,
    )


def compression_from_segments(
    segments: Sequence[Sequence[str]],
    *,
    base_tokenizer: Callable[[str], Sequence[object]] | object | None = None,
) -> CompressionResult:
    """Compression from generated segment lists: ``segments[i][j]`` is the text emitted at step ``j`` of sequence ``i``.

    The text of a sequence is ``"".join(segments[i])`` and its step count ``len(segments[i])``.
    """
    if isinstance(segments, str) or any(isinstance(seq, str) for seq in segments):
        raise TypeError("segments must be a list of lists of str (one list per sequence), e.g. [['The', ' cat']]")
    texts = ["".join(seq) for seq in segments]
    return compression(texts, [len(seq) for seq in segments], base_tokenizer=base_tokenizer)
