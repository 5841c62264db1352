"""The NAR retriever end to end on the embedded leads: docid tokenizers, training, ranking documents.

Shared by ``dynvocab build-vocab``/``nar-train``/``nar-search`` and ``examples/nar_experiment.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dynvocab.scoring.shortlist_head import ShortlistHead

from .model import NarConfig, NarRetriever
from .training import NarTrainConfig, NarTrainer, docid_targets
from .trie import DocidTrie, aggregate_documents
from .vocab import DocidTokenizer, HFDocidTokenizer, PhraseVocabConfig, PhraseVocabulary, train_baseline

__all__ = ["docid_tokenizer", "rank_documents", "token_texts", "train_retriever"]

logger = logging.getLogger(__name__)

#: docid positions allowed at most (a docid longer than this minus one in ids is refused)
MAX_POSITIONS = 24


def docid_tokenizer(kind: str, docids: Sequence[str], size: int) -> DocidTokenizer:
    """``"phrase"`` (this library's builder), ``"bpe"`` or ``"unigram"`` (``tokenizers``) trained on ``docids`` at ``size``."""
    if kind == "phrase":
        return PhraseVocabulary.train(docids, PhraseVocabConfig(size=size))
    if kind in ("bpe", "unigram"):
        return train_baseline(kind, docids, size)
    raise ValueError(f"kind={kind!r}; choose 'phrase', 'bpe' or 'unigram'")


def token_texts(tokenizer: DocidTokenizer) -> list[str]:
    """Each id's text as words (special tokens empty), to start the output layer from the encoder's embeddings."""
    if isinstance(tokenizer, PhraseVocabulary):
        return [t if i >= 3 else "" for i, t in enumerate(tokenizer.tokens)]
    if isinstance(tokenizer, HFDocidTokenizer):
        return [(tokenizer.tokenizer.id_to_token(i) or "").replace("\u2581", " ") if i >= 3 else ""
                for i in range(tokenizer.vocab_size)]
    raise TypeError(f"unknown docid tokenizer {type(tokenizer).__name__}")


def train_retriever(tokenizer: DocidTokenizer, docids: Sequence[str], queries: Sequence[str], documents: Sequence[int],
                    train: NarTrainConfig, encoder: str = "minilm", resume: bool = False, max_query_length: int = 64,
                    x0_pooling: str = "cls", position_states: str = "encoder", features: torch.Tensor | None = None
                    ) -> NarRetriever:
    """Train a NAR retriever on ``queries[i] -> docids[documents[i]]``; a finished run in ``train.output_dir`` is loaded.
    ``features``: cached ``x0`` of the queries (frozen encoder, projected positions)."""
    final = Path(train.output_dir) / "final"
    if (final / "manifest.json").exists() and not resume:
        logger.info("loading the trained retriever from %s", final)
        return NarRetriever.from_pretrained(final)
    lengths = [len(ids) for ids in tokenizer.encode_batch(list(docids))]
    positions = max(lengths) + 1
    if positions > MAX_POSITIONS:
        raise ValueError(f"the longest docid takes {max(lengths)} ids, more than {MAX_POSITIONS - 1}; raise the vocabulary size")
    config = NarConfig(encoder=encoder, vocab_size=tokenizer.vocab_size, positions=positions, max_query_length=max_query_length,
                       x0_pooling=x0_pooling, position_states=position_states)
    targets, _ = docid_targets([docids[d] for d in documents], tokenizer, positions)
    model = NarRetriever.from_encoder(config, token_texts(tokenizer))
    resume = resume or any(Path(train.output_dir).glob("checkpoint-*"))
    NarTrainer(model, queries, targets, tokenizer.end_id, train, features).train(resume=resume)
    return model


@torch.no_grad()
def rank_documents(model: NarRetriever, queries: Sequence[str], trie: DocidTrie, document_of_docid: torch.Tensor,
                   head: ShortlistHead | None = None, beam_size: int = 100, batch_size: int = 64
                   ) -> tuple[list[list[int]], dict[str, float]]:
    """Ranked document indices per query (best first) and the totals: seconds encoding and searching, candidates."""
    model.eval()
    rankings: list[list[int]] = []
    totals = {"encode_s": 0.0, "search_s": 0.0, "candidates": 0.0}
    for start in tqdm(range(0, len(queries), batch_size), desc="nar-search", disable=len(queries) <= batch_size):
        batch = list(queries[start : start + batch_size])
        result, stats = model.search(batch, trie, head, beam_size)
        documents, _ = aggregate_documents(result, document_of_docid, "max")
        rankings.extend([d for d in row if d >= 0] for row in documents.tolist())
        totals["encode_s"] += stats.encode_s
        totals["search_s"] += stats.search_s
        totals["candidates"] += stats.candidates * len(batch)
    totals["candidates"] /= max(len(queries), 1)
    return rankings, totals
