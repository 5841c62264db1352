"""The drafts an index's whole corpus offers where a request's documents have none (``CorpusDrafts``), built once."""

from __future__ import annotations

import logging
import time
import weakref

from dynvocab.decoding import CorpusDrafts

__all__ = ["corpus_drafts"]

logger = logging.getLogger(__name__)

#: index -> {tokenizer name: CorpusDrafts}, made by the first request that fills drafts from it
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def corpus_drafts(index, tokenizer) -> CorpusDrafts:
    """What most often follows each context across ``index``'s documents, in ``tokenizer``'s tokens: built at the
    first call for the pair (seconds: every document is tokenized) and kept while the index lives."""
    built = _BUILT.setdefault(index, {})
    if tokenizer.name_or_path not in built:
        texts = [document["text"] for document in index.documents]
        start = time.perf_counter()
        built[tokenizer.name_or_path] = CorpusDrafts(tokenizer(texts, add_special_tokens=False).input_ids)
        logger.info("corpus drafts: %d contexts of %d documents in %.1f s", len(built[tokenizer.name_or_path]),
                    len(texts), time.perf_counter() - start)
    return built[tokenizer.name_or_path]
