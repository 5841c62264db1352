"""Phrase vectors of every document in an index, computed once and kept beside it (``dynvocab phrase-vectors``).

A request plugs in the phrases cut from its top-k documents. Without a store, the model encodes
them per request (about 1.7 s for 2,048 phrases on 2 CPU cores), though the same documents come
back request after request. :func:`build_phrase_vectors` cuts every document's phrases the way
the pipeline does, encodes each distinct phrase once and writes the vectors into
``<index folder>/phrase_vectors`` (``dynvocab.phrases.store``), a shard of documents at a time, so
an interrupted build resumes where it stopped. :func:`attach_phrase_vectors` (called by
``PhrasePipeline``) lets the model read them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dynvocab import DynamicVocabLM
from dynvocab.phrases.store import (
    PHRASE_VECTORS,
    STORE_FILE,
    PhraseVectorStore,
    encoder_fingerprint,
    finished_shards,
    flatten,
    phrase_keys,
    shard_path,
    start_or_resume,
    write_shard,
)

from .index.documents import documents_record, warn_if_other_documents
from .index.storage import folder_beside
from .phrases import extract_phrases, tokenized_phrases

__all__ = ["STORE_FOLDER", "attach_phrase_vectors", "build_phrase_vectors", "store_path"]

logger = logging.getLogger(__name__)

#: the store's folder inside an index folder
STORE_FOLDER = "phrase_vectors"
#: the pipeline settings that decide which phrases a document gives
EXTRACTION = ("unit", "min_length", "max_length", "edges")


def store_path(index_dir: str | Path) -> Path:
    return Path(index_dir) / STORE_FOLDER


def build_phrase_vectors(
    model: DynamicVocabLM,
    index: Any,
    config: Any,
    directory: str | Path | None = None,
    shard_documents: int = 256,
    overwrite: bool = False,
    show_progress_bar: bool | None = None,
) -> PhraseVectorStore:
    """Encode the phrases of every document of ``index`` once; returns the store (resumes an interrupted build).

    Args:
        model: the model whose phrase encoder and dtypes make the vectors.
        index: a ``DocumentIndex`` or ``HybridIndex`` (its ``documents``).
        config: the ``PipelineConfig`` that will cut phrases at request time (unit, lengths, edges).
        directory: where to write; default ``<index folder>/phrase_vectors``.
        shard_documents: documents per shard (one atomic write, the unit of resume).
        overwrite: replace a store built with another encoder, dtypes, documents or settings.
    """
    if shard_documents < 1:
        raise ValueError(f"shard_documents={shard_documents} must be >= 1")
    directory = Path(directory) if directory is not None else folder_beside(index, STORE_FOLDER)
    settings = model.dynvocab_config
    record = {
        "fingerprint": encoder_fingerprint(model.phrase_encoder, settings.encode_dtype, settings.phrase_dtype),
        "encode_dtype": settings.encode_dtype,
        "phrase_dtype": settings.phrase_dtype,
        "dim": model.phrase_encoder.output_size,
        "documents": documents_record(index.documents),
        "extraction": {name: getattr(config, name) for name in EXTRACTION},
        "max_phrase_tokens": model.phrase_table.max_phrase_tokens,
        "shard_documents": shard_documents,
    }
    start_or_resume(directory, record, overwrite, PHRASE_VECTORS)
    done = finished_shards(directory)
    seen = _stored_keys(directory, done)
    shards = -(-len(index.documents) // shard_documents)
    show = shards > 1 if show_progress_bar is None else show_progress_bar
    for number in tqdm(range(shards), desc="phrase vectors", unit="shard", disable=not show):
        if number in done:
            continue
        documents = index.documents[number * shard_documents : (number + 1) * shard_documents]
        token_ids = _new_phrases(documents, model, config, seen)
        empty = torch.zeros(0, record["dim"], dtype=getattr(torch, settings.phrase_dtype))
        write_shard(directory, number, token_ids, model.encode_output_vectors(token_ids) if token_ids else empty)
    store = PhraseVectorStore(directory)
    logger.info("phrase vectors: %d phrases of %d documents in %s", len(store), len(index.documents), directory)
    return store


def _stored_keys(directory: Path, shards: list[int]) -> set[int]:
    """Keys of the phrases the finished shards hold (a phrase is stored once, in the first shard that cut it)."""
    seen: set[int] = set()
    for number in shards:
        path = shard_path(directory, number)
        seen.update(phrase_keys(np.load(path / "token_ids.npy"), np.load(path / "offsets.npy")).tolist())
    return seen


def _new_phrases(documents: list[dict], model: DynamicVocabLM, config: Any, seen: set[int]) -> list[tuple[int, ...]]:
    """Token ids of the phrases the pipeline would cut from each document alone, minus those in ``seen`` (updated)."""
    limit, fresh = model.phrase_table.max_phrase_tokens, []
    for document in documents:
        found = extract_phrases([document], model.tokenizer, unit=config.unit, min_length=config.min_length,
                                max_length=config.max_length, edges=config.edges, ranking="relevance")
        fresh += [ids for _, ids in tokenized_phrases(found, model.tokenizer, limit)]
    if not fresh:
        return []
    keys = phrase_keys(*flatten(fresh)).tolist()
    kept = []
    for key, ids in zip(keys, fresh):
        if key not in seen:
            seen.add(key)
            kept.append(ids)
    return kept


def attach_phrase_vectors(model: DynamicVocabLM, index: Any) -> PhraseVectorStore | None:
    """Have ``model`` read the phrase vectors kept beside ``index``'s folder, when there are any this model can use.

    A store made by another encoder is not used (logged, with the command that rebuilds it); one made for
    other documents is used, with a warning that fewer phrases will be found.
    """
    folder = getattr(index, "directory", None)
    if model.phrase_store is not None or folder is None or not (store_path(folder) / STORE_FILE).is_file():
        return model.phrase_store
    store = PhraseVectorStore(store_path(folder))
    try:
        model.use_phrase_store(store)
    except ValueError:  # another encoder's store (the shipped one's, say, while another checkpoint is evaluated)
        logger.info("the phrase vectors in %s come from another phrase encoder or dtypes: this model encodes its "
                    "phrases per request (`dynvocab phrase-vectors --index %s --overwrite` makes them for it)",
                    store.directory, folder)
        return None
    warn_if_other_documents(store.directory, store.record, index.documents, "phrase vectors",
                            f"dynvocab phrase-vectors --index {folder}")
    return store
