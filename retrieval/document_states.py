"""The LM's states over every document of an index, computed once and kept beside it (``dynvocab document-states``).

A request with a state gate (``state_threshold``) keys its phrases by the LM's states over its documents
(``dynvocab.states.keys``). Without a store, each process reads a document the first time a request retrieves it:
about 0.17 s a Wikipedia lead on 2 CPU cores, 1.7 s for a served request's 8 new documents.
:func:`build_document_states` reads every indexed document once, as the pipeline and the server tokenize it, into
``<index folder>/document_states`` (``dynvocab.states.store``), a shard of documents at a time, so an interrupted build
resumes where it stopped. :func:`attach_document_states` (called by ``PhrasePipeline`` and the server) lets a
``DocumentStates`` read them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dynvocab.phrases.store import STORE_FILE
from dynvocab.states.kv import DocumentKV
from dynvocab.states.store import DocumentStates, DocumentStateStore, write_document_states

from .index.documents import documents_record, warn_if_other_documents
from .index.storage import folder_beside
from .reading import document_context_ids

__all__ = ["KV_FOLDER", "STATES_FOLDER", "attach_document_states", "build_document_kv", "build_document_states",
           "document_token_ids", "states_path", "stored_documents"]

logger = logging.getLogger(__name__)

#: the stores' folders inside an index folder: the state gate's states, grounded decoding's keys and values
STATES_FOLDER, KV_FOLDER = "document_states", "document_kv"


def states_path(index_dir: str | Path, states: DocumentStates | None = None) -> Path:
    """Where the store of ``states``' kind (default: the state gate's) is kept beside an index."""
    return Path(index_dir) / (KV_FOLDER if isinstance(states, DocumentKV) else STATES_FOLDER)


def document_token_ids(tokenizer: Any, documents: list[dict]) -> list[list[int]]:
    """Each document's text as token ids, without special tokens: what the state gate reads, and the store's key."""
    return tokenizer([d["text"] for d in documents], add_special_tokens=False).input_ids if documents else []


def build_document_states(
    states: DocumentStates,
    tokenizer: Any,
    index: Any,
    directory: str | Path | None = None,
    dtype: str = "float16",
    shard_documents: int = 256,
    overwrite: bool = False,
    show_progress_bar: bool | None = None,
) -> DocumentStateStore:
    """Read every document of ``index`` once with ``states`` (a ``DocumentStates`` of the LM that will decode:
    its weights, ``max_tokens`` and batch size) and keep the states beside the index; returns the store.

    Args:
        states: the LM's ``DocumentStates``; make it with ``max_bytes=0`` so it keeps nothing in memory.
        tokenizer: the LM's tokenizer.
        index: a ``DocumentIndex`` or ``HybridIndex`` (its ``documents``).
        directory: where to write; default ``<index folder>/document_states``.
        dtype: ``"float16"`` (half the disk; keys within 1e-6 cosine of the LM's own on Wikipedia) or ``"float32"``.
        shard_documents: documents per shard (one atomic write, the unit of resume).
        overwrite: replace a store built for another LM, documents or settings.
    """
    directory = Path(directory) if directory is not None else folder_beside(index, STATES_FOLDER)
    record = {"documents": documents_record(index.documents)}
    return write_document_states(states, document_token_ids(tokenizer, index.documents), directory, record, dtype,
                                 shard_documents, overwrite, show_progress_bar)


def build_document_kv(
    kv: DocumentKV,
    tokenizer: Any,
    index: Any,
    read_tokens: int,
    directory: str | Path | None = None,
    dtype: str = "float32",
    shard_documents: int = 64,
    overwrite: bool = False,
    show_progress_bar: bool | None = None,
) -> DocumentStateStore:
    """Read every document of ``index`` once with ``kv`` (a ``DocumentKV`` of the LM that will decode, ``max_bytes=0``)
    as grounded decoding reads it (``retrieval.reading.document_context_ids``: cut to ``read_tokens`` tokens, a blank
    line after) and keep its keys and values beside the index (default ``<index folder>/document_kv``); resumable by
    shard, as ``build_document_states``. A 384-token document of SmolLM2-135M takes 17.7 MB in float32 (the first
    document exactly as the LM reads it; ``dtype="float16"`` halves it)."""
    directory = Path(directory) if directory is not None else folder_beside(index, KV_FOLDER)
    record = {"documents": documents_record(index.documents), "read_tokens": read_tokens}
    after = {"text": "A"}  # as read first and followed by another document: the part a request reads from the store
    ids = [document_context_ids(tokenizer, [document, after], read_tokens)[0] for document in index.documents]
    return write_document_states(kv, ids, directory, record, dtype, shard_documents, overwrite, show_progress_bar)


def stored_documents(config: Any, kv: DocumentKV | None, indexes: Iterable[Any]) -> int:
    """How many of the documents grounded decoding reads come as keys and values read once: ``config.document_kv``
    (a ``PipelineConfig``), or with None 1 where ``kv`` reads a float32 store kept beside one of ``indexes`` for its LM
    (``dynvocab document-kv``: the first document's are the LM's own, so the text is the same) and the documents are
    read no longer than ``kv`` keeps them, else 0. ``kv`` None: an LM without rotary embeddings, which reads every
    document itself."""
    if config.document_kv is not None:
        return config.document_kv
    if kv is None or not (config.grounded and config.read_documents) or config.read_tokens > kv.max_tokens:
        return 0
    stores = [attach_document_states(kv, index) for index in indexes]
    return int(any(store is not None and store.record["dtype"] == "float32" for store in stores))


def attach_document_states(states: DocumentStates, index: Any) -> DocumentStateStore | None:
    """Have ``states`` read the LM states of its kind kept beside ``index``'s folder, when there are any for its LM.

    A store made by another LM or for another ``max_tokens`` is not used (logged once, with the command that
    rebuilds it); one made for other documents is used, with a warning that fewer documents will be found.
    """
    folder = getattr(index, "directory", None)
    path = states_path(folder, states) if folder is not None else None
    if path is None or path in states.refused or not (path / STORE_FILE).is_file():
        return None  # none there, or refused once already (not logged again)
    attached = next((store for store in states.stores if store.directory == path), None)
    if attached is not None:
        return attached
    store = states.store_class(path)
    try:
        states.use_store(store)
    except ValueError as error:
        logger.info("%s: the LM reads each retrieved document itself", error)
        return None
    warn_if_other_documents(store.directory, store.record, index.documents, states.kind.what,
                            states.kind.command.replace("<index folder>", str(folder)))
    return store
