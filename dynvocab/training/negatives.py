"""Negative phrases for training the phrase encoder, as token-id tuples.

Each source of the paper is a plain function (or a small class), and
:class:`NegativeSampler` combines the ones named in its config:

==================  ==========================================================
``in-batch``        the batch's gold phrases (the caller's phrase set has them)
``pre-batch``       gold phrases of the previous k batches (:class:`PreBatchQueue`)
``prefix``          proper prefixes of each gold phrase (:func:`prefix_negatives`)
``self-retrieval``  the gold phrase extended by the next tokens of its own text
``corpus-retrieval`` the gold phrase extended where it occurs in a support corpus
``generation``      the gold phrase extended by the base LM's greedy continuation
``same-text``       other spans of the sample's own text that its sampler could have chosen:
                    on topic but mostly in the wrong place, as phrases cut from a retrieved
                    document are at decoding time (:func:`same_text_negatives`)
==================  ==========================================================

:func:`group_by_prefix` packs phrases so one causal encoder pass over the longest
string yields the vectors of all its prefixes.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..tokens.ngrams import SuccessorIndex
from ..tokens.padding import pad_sequences, position_ids_from_mask
from .samples import MixedSample

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "NegativeSampler",
    "PreBatchQueue",
    "PrefixGroups",
    "SOURCES",
    "generation_negatives",
    "greedy_continuations",
    "group_by_prefix",
    "prefix_groups",
    "prefix_negatives",
    "same_text_negatives",
    "self_retrieval_negatives",
]

logger = logging.getLogger(__name__)

Phrase = tuple[int, ...]
SOURCES = ("in-batch", "pre-batch", "prefix", "self-retrieval", "corpus-retrieval", "generation", "same-text")


def prefix_negatives(phrase: Sequence[int]) -> list[Phrase]:
    """Every proper prefix of ``phrase`` with at least 2 tokens, shortest first.

    A 1-token prefix is an ordinary vocabulary token, which the model already scores
    against the phrase, so it is not returned.
    """
    phrase = tuple(phrase)
    return [phrase[:k] for k in range(2, len(phrase))]


def self_retrieval_negatives(
    sample: MixedSample, span_index: int, n: int = 3, max_phrase_tokens: int = 8
) -> list[Phrase]:
    """The gold phrase ``sample.phrase_spans[span_index]`` extended by its next 1..``n`` tokens in ``sample``.

    Stops at the end of the sample and at ``max_phrase_tokens`` tokens.
    """
    start, end = sample.phrase_spans[span_index]
    last = min(end + n, len(sample.token_ids), start + max_phrase_tokens)
    return [tuple(sample.token_ids[start:stop]) for stop in range(end + 1, last + 1)]


def same_text_negatives(sample: MixedSample, n: int, rng: random.Random) -> list[Phrase]:
    """Up to ``n`` distinct phrases of ``sample.candidate_spans`` that are not its golds, drawn at random."""
    golds = set(sample.phrases())
    spans = list(dict.fromkeys(tuple(sample.token_ids[a:b]) for a, b in sample.candidate_spans))
    spans = [p for p in spans if p not in golds]
    return rng.sample(spans, min(n, len(spans)))


@torch.no_grad()
def greedy_continuations(
    model: PreTrainedModel, phrases: Sequence[Sequence[int]], n: int = 3, pad_token_id: int = 0
) -> torch.Tensor:
    """Greedy ``n``-token continuations of each phrase by a causal LM, batched with left padding.

    Returns a ``(len(phrases), n)`` long tensor. Positions are counted from each row's
    first real token, so a padded row continues exactly as it would alone. The model is
    put in eval mode for the call (no dropout) and restored afterwards.
    """
    ids, mask = pad_sequences(phrases, pad_token_id, side="left", device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        generated, cache, step_ids = [], None, ids
        for _ in range(n):
            positions = position_ids_from_mask(mask)[:, -step_ids.shape[1] :]
            out = model(
                input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
                logits_to_keep=1,
            )
            cache, step_ids = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            generated.append(step_ids)
            mask = torch.cat([mask, torch.ones_like(step_ids)], dim=1)
    finally:
        model.train(was_training)
    return torch.cat(generated, dim=1)


def generation_negatives(
    model: PreTrainedModel, phrases: Sequence[Sequence[int]], n: int = 3, batch_size: int = 64, pad_token_id: int = 0
) -> list[Phrase]:
    """``phrase + continuation[:j]`` for j in 1..``n``, continuing each phrase greedily with ``model``.

    ``model`` is the base causal LM (a ``PreTrainedModel`` taking ``input_ids``,
    ``attention_mask``, ``position_ids`` and a KV cache). Phrases go in batches of
    ``batch_size``, sorted by length to limit padding; results follow the input order.
    """
    if n < 1:
        raise ValueError(f"n={n} must be >= 1 generated tokens; pass e.g. 3")
    phrases = [tuple(p) for p in phrases]
    if any(len(p) == 0 for p in phrases):
        raise ValueError("phrases contains an empty phrase; every phrase needs at least one token id")
    order = sorted(range(len(phrases)), key=lambda i: len(phrases[i]))
    continuation: dict[int, list[int]] = {}
    for begin in range(0, len(order), batch_size):
        rows = order[begin : begin + batch_size]
        tokens = greedy_continuations(model, [phrases[i] for i in rows], n, pad_token_id)
        continuation.update(zip(rows, tokens.tolist()))
    return [phrases[i] + tuple(continuation[i][:j]) for i in range(len(phrases)) for j in range(1, n + 1)]


class PreBatchQueue:
    """Gold phrases of the last ``num_batches`` batches (the paper's pre-batch negatives)."""

    def __init__(self, num_batches: int = 1) -> None:
        if num_batches < 1:
            raise ValueError(f"num_batches={num_batches} must be >= 1 previous batches to remember; pass e.g. 1")
        self._batches: deque[list[Phrase]] = deque(maxlen=num_batches)

    def push(self, batch_phrases: Iterable[Sequence[int]]) -> None:
        """Remember one batch's phrases, forgetting the oldest batch when full."""
        self._batches.append([tuple(p) for p in batch_phrases])

    def get(self) -> list[Phrase]:
        """Distinct remembered phrases, most recent batch first."""
        return list(dict.fromkeys(p for batch in reversed(self._batches) for p in batch))

    def __len__(self) -> int:
        return len(self._batches)

    def state_dict(self) -> dict:
        """The remembered batches, for an exact resume."""
        return {"batches": [list(batch) for batch in self._batches]}

    def load_state_dict(self, state: dict) -> None:
        """Replace the remembered batches with those of :meth:`state_dict`."""
        self._batches.clear()
        self._batches.extend([tuple(p) for p in batch] for batch in state["batches"])


class NegativeSampler:
    """Combine negative sources by name; ``sampler(batch)`` gives the batch's negatives.

    ``in-batch`` adds nothing to the returned list: the batch's gold phrases are
    already in the phrase set the caller builds, and every gold phrase is removed from
    the negatives. :attr:`in_batch` tells the caller whether other samples' golds
    should count as negatives. Results are distinct, 2..``max_phrase_tokens`` tokens
    long, in order of first appearance; ``max_negatives`` keeps a random subset.
    ``pre-batch`` remembers each call's golds, so call the sampler once per batch.
    """

    def __init__(
        self,
        names: Sequence[str],
        *,
        successor_index: SuccessorIndex | None = None,
        model: PreTrainedModel | None = None,
        num_prebatches: int = 1,
        retrieval_tokens: int = 3,
        max_occurrences: int = 16,
        generation_tokens: int = 3,
        generation_phrases: int = 16,
        same_text_phrases: int = 16,
        max_phrase_tokens: int = 8,
        max_negatives: int | None = None,
        seed: int = 0,
    ) -> None:
        unknown = [name for name in names if name not in SOURCES]
        if unknown:
            raise ValueError(f"names={list(names)} has unknown sources {unknown}; choose from {list(SOURCES)}")
        if "corpus-retrieval" in names and successor_index is None:
            raise ValueError("names includes 'corpus-retrieval' but successor_index=None; pass a SuccessorIndex")
        if "generation" in names and model is None:
            raise ValueError("names includes 'generation' but model=None; pass the base causal LM")
        if max_phrase_tokens < 2:
            raise ValueError(f"max_phrase_tokens={max_phrase_tokens} must be >= 2; pass e.g. 8")
        self.names = list(dict.fromkeys(names))
        self.in_batch = "in-batch" in self.names
        self.successor_index, self.model = successor_index, model
        self.queue = PreBatchQueue(num_prebatches)
        self.retrieval_tokens, self.max_occurrences = retrieval_tokens, max_occurrences
        self.generation_tokens, self.max_phrase_tokens = generation_tokens, max_phrase_tokens
        self.generation_phrases, self.same_text_phrases = generation_phrases, same_text_phrases
        self.max_negatives = max_negatives
        self.rng = random.Random(seed)

    def __call__(self, batch: Sequence[MixedSample]) -> list[Phrase]:
        """Negatives for ``batch``: distinct token tuples, no gold phrase of the batch, none of length 1."""
        golds = list(dict.fromkeys(p for sample in batch for p in sample.phrases()))
        found: list[Phrase] = []
        for name in self.names:
            found.extend(self._source(name, batch, golds))
        if "pre-batch" in self.names:
            self.queue.push(golds)
        gold_set = set(golds)
        negatives = [
            p for p in dict.fromkeys(found) if 2 <= len(p) <= self.max_phrase_tokens and p not in gold_set
        ]
        if self.max_negatives is not None and len(negatives) > self.max_negatives:
            keep = sorted(self.rng.sample(range(len(negatives)), self.max_negatives))
            negatives = [negatives[i] for i in keep]
        logger.debug("%d gold phrases, %d negatives", len(golds), len(negatives))
        return negatives

    def state_dict(self) -> dict:
        """Pre-batch queue and random state, for an exact resume (JSON-able: lists, ints, None)."""
        version, internal, gauss = self.rng.getstate()
        return {"queue": self.queue.state_dict(), "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.queue.load_state_dict(state["queue"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))

    def _source(self, name: str, batch: Sequence[MixedSample], golds: list[Phrase]) -> list[Phrase]:
        if name == "pre-batch":
            return self.queue.get()
        if name == "prefix":
            return [p for gold in golds for p in prefix_negatives(gold)]
        if name == "self-retrieval":
            return [
                p
                for sample in batch
                for index in range(len(sample.phrase_spans))
                for p in self_retrieval_negatives(sample, index, self.retrieval_tokens, self.max_phrase_tokens)
            ]
        if name == "corpus-retrieval":
            return [
                p
                for gold in golds
                for p in self.successor_index.successors(gold, self.retrieval_tokens, self.max_occurrences)
            ]
        if name == "same-text":
            return [p for sample in batch for p in same_text_negatives(sample, self.same_text_phrases, self.rng)]
        if name == "generation" and golds:
            short = [gold for gold in golds if len(gold) < self.max_phrase_tokens]
            if len(short) > self.generation_phrases:  # continuing every gold through the whole LM costs too much
                short = self.rng.sample(short, self.generation_phrases)
            return generation_negatives(self.model, short, self.generation_tokens) if short else []
        return []  # "in-batch", or no golds to continue


@dataclass(frozen=True)
class PrefixGroups:
    """Phrases packed by shared prefixes.

    ``groups[g] = (longest, lengths)``: encoding ``longest`` once gives, at token
    position ``length - 1``, the vector of its prefix of each needed length. Input
    phrase ``i`` is ``groups[group_of[i]][0][:length_of[i]]``, so with encoder states
    ``hidden`` of shape ``(n_groups, max_len, d)`` the vectors in input order are
    ``hidden[group_of, length_of - 1]``, shape ``(n_inputs, d)``.
    """

    groups: list[tuple[Phrase, list[int]]]
    group_of: list[int]
    length_of: list[int]


def prefix_groups(phrases: Sequence[Sequence[int]]) -> PrefixGroups:
    """Group ``phrases`` so that each one that is a prefix of another is served by a longer one.

    Groups are in lexicographic order of their longest string; duplicate inputs share
    an entry. Runs in O(total tokens * log) via one sort.
    """
    phrases = [tuple(p) for p in phrases]
    if any(len(p) == 0 for p in phrases):
        raise ValueError("phrases contains an empty phrase; every phrase needs at least one token id")
    distinct = sorted(set(phrases))
    # In sorted order a phrase's extensions follow it directly, so walk backwards and
    # hand each phrase the group of its successor when that successor extends it.
    head = list(range(len(distinct)))
    for k in range(len(distinct) - 2, -1, -1):
        following = distinct[k + 1]
        if following[: len(distinct[k])] == distinct[k]:
            head[k] = head[k + 1]
    heads = sorted(set(head))
    group_index = {h: g for g, h in enumerate(heads)}
    lengths: dict[int, set[int]] = {g: set() for g in range(len(heads))}
    slot = {}
    for k, phrase in enumerate(distinct):
        g = group_index[head[k]]
        lengths[g].add(len(phrase))
        slot[phrase] = g
    groups = [(distinct[h], sorted(lengths[group_index[h]])) for h in heads]
    return PrefixGroups(groups, [slot[p] for p in phrases], [len(p) for p in phrases])


def group_by_prefix(phrases: Sequence[Sequence[int]]) -> list[tuple[Phrase, list[int]]]:
    """``(longest string, sorted lengths needed)`` pairs covering every input phrase exactly once.

    See :func:`prefix_groups` for the mapping back to input order.
    """
    return prefix_groups(phrases).groups
