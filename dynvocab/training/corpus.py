"""Training texts: one at a time from any source ``dynvocab.data.sources`` reads (``iter_texts``), the offline
Wikipedia stand-in split into train and held-out (``wikipedia_split``), a config's training part and its epochs
(``training_texts``, ``epoch_texts``), and endless batches of their ids (``batches``): what every trainer reads."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ..data.corpora import CORPORA, WIKIPEDIA_HELD_OUT, corpus_split, split_documents
from ..data.sources import iter_records

__all__ = ["CorpusSettings", "batches", "check_corpus_settings", "corpus_field", "epoch_texts", "iter_texts",
           "training_texts", "wikipedia_split"]


@dataclass
class CorpusSettings:
    """The training texts' share of a trainer's config: what ``training_texts``, ``epoch_texts`` and ``batches`` read
    (with the loop's ``seed``)."""

    data: str = field(default="wikipedia", metadata={"help": "Text/JSONL file, datasets name or dir, or an embedded "
                                                             "corpus (its indexed part): 'wikipedia', 'licenses', "
                                                             "'licensedb', 'licensedb-families'."})
    text_field: str = field(default="text", metadata={"help": "Field holding the text in JSONL files and datasets."})
    held_out: float = field(default=WIKIPEDIA_HELD_OUT, metadata={"help": "Share of the offline Wikipedia leads held out "
                                                                          "from training (dynvocab eval prompts with them)."})


def corpus_field(name: str, default):
    """A :class:`CorpusSettings` field with another default (and the same help), for a trainer whose default differs."""
    return field(default=default, metadata=CorpusSettings.__dataclass_fields__[name].metadata)


def check_corpus_settings(settings: CorpusSettings) -> None:
    """Raise ``ValueError`` naming the field and the fix for corpus settings no trainer can read."""
    if not 0.0 < settings.held_out < 1.0:
        raise ValueError(f"held_out={settings.held_out} must be a fraction in (0, 1)")


def iter_texts(
    source: str | os.PathLike | Iterable[str],
    text_field: str = "text",
    streaming: bool = True,
    *,
    split: str = "train",
    name: str | None = None,
    paragraphs: bool | None = None,
) -> Iterator[str]:
    """Yield the non-empty texts of ``source`` one by one, stripped of surrounding whitespace.

    ``source`` is anything ``dynvocab.data.sources.iter_records`` reads (a JSONL or text file, a ``datasets`` folder,
    a Hub dataset name, a ``datasets`` object, an iterable of strings); a large corpus is never loaded whole. A
    missing path raises ``ValueError`` at the call; a bad record raises when it is reached.
    """
    records = iter_records(source, text_field, streaming=streaming, split=split, name=name, paragraphs=paragraphs)
    return _non_empty(record.text(text_field) for record in records)


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        text = text.strip()
        if text:
            yield text


def wikipedia_split(held_out: float = WIKIPEDIA_HELD_OUT, seed: int = 0) -> tuple[list[str], list[str]]:
    """(train, held-out) texts of the offline Wikipedia leads (``dynvocab.data.assets.wikipedia_leads``)."""
    from dynvocab.data.assets import wikipedia_leads

    train, heldout = split_documents(wikipedia_leads(), held_out, seed)
    return [d["text"] for d in train], [d["text"] for d in heldout]


def training_texts(config) -> list[str] | Iterator[str]:
    """The training part of ``config.data`` (any trainer's config: ``data``, ``held_out``, ``text_field``); the offline Wikipedia split does not depend on ``config.seed``,
    so the held-out documents that ``dynvocab eval`` uses are never trained on."""
    if config.data == "wikipedia":
        return wikipedia_split(held_out=config.held_out)[0]
    if config.data in CORPORA:  # the other embedded corpora: their indexed part, the split eval holds out from
        return [document["text"] for document in corpus_split(config.data)[0]]
    return iter_texts(config.data, text_field=config.text_field)


def epoch_texts(config, epoch: int) -> list[str] | Iterator[str]:
    """One epoch of training texts: an in-memory corpus reshuffled with ``config.seed + epoch``; a file or dataset streams in order."""
    texts = training_texts(config)
    if isinstance(texts, list):
        texts = random.Random(config.seed + epoch).sample(texts, len(texts))
    return texts


def batches(
    config, encode: Callable[[str], list[int]], shard: int = 0, num_shards: int = 1, whole: bool = False
) -> Iterator[list[list[int]]]:
    """Endless batches of id sequences, ``encode`` of each training text of ``config`` (its ``data``, ``seed``,
    ``max_length`` and ``batch_size``), one epoch after another (see ``epoch_texts``): each text's first
    ``max_length`` ids, or with ``whole`` every ``max_length`` window of them.

    Shard ``shard`` of ``num_shards`` gets the ``shard``-th ``batch_size`` of each global batch of
    ``batch_size * num_shards`` sequences (as ``sample_stream`` does for the phrase encoder).
    """

    def sequences() -> Iterator[list[int]]:
        for epoch in itertools.count():
            found = False
            for text in epoch_texts(config, epoch):
                ids = encode(text)
                for start in range(0, len(ids) if whole else 1, config.max_length):
                    window = ids[start : start + config.max_length]
                    if len(window) >= 2:
                        found = True
                        yield window
            if not found:
                raise ValueError(f"data={config.data!r} has no text of 2 or more tokens; pass a corpus with text in it")

    stream = sequences()
    while True:
        batch = [next(stream) for _ in range(config.batch_size * num_shards)]
        yield batch[shard * config.batch_size : (shard + 1) * config.batch_size]
