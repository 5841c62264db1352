"""What decoding takes from a request's documents, with no index: the phrases cut from them, where each phrase
follows, what the LM reads of them in its context, drafts from them, and the spans of a continuation they hold.

``PhrasePipeline`` is a ``DocumentReader`` that retrieves the documents first; the server's engine reads the documents
a request brings or retrieves with one of its own.
"""

from __future__ import annotations

import bisect
import logging
import weakref
from collections.abc import Sequence

from dynvocab import DynamicVocabLM, Phrase
from dynvocab.decoding import Citation, CorpusDrafts, DocumentDrafter, cite
from dynvocab.decoding.verification import draft_step_cost

from .config import PipelineConfig
from .phrases import document_contexts, extract_phrases, tokenized_phrases

logger = logging.getLogger(__name__)
#: model -> {draft length: dynvocab.decoding.verification.draft_step_cost}, measured at its first drafted request
_DRAFT_STEP_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def in_context_ids(tokenizer, documents: list[dict], read_tokens: int) -> list[int]:
    """``documents``' texts, each cut to ``read_tokens`` tokens, joined by blank lines and followed by one, as the token
    ids an LM reads before a prompt (tokenized without special tokens after these); [] for no documents."""
    if not documents or not read_tokens:
        return []
    return tokenizer("\n\n".join(_cut(tokenizer, documents, read_tokens)) + "\n\n").input_ids


def _cut(tokenizer, documents: list[dict], read_tokens: int) -> list[str]:
    """Each document's text cut to its first ``read_tokens`` tokens."""
    return [tokenizer.decode(ids[:read_tokens])
            for ids in tokenizer([d["text"] for d in documents], add_special_tokens=False).input_ids]


def document_context_ids(tokenizer, documents: list[dict], read_tokens: int) -> list[list[int]]:
    """``in_context_ids`` cut where each document starts (special tokens go with the first), so that a document's
    part can be read, and kept, on its own (``dynvocab.states.kv``): joined, the parts are exactly the ids the LM
    reads. A part ends with the blank line after its document. [] for no documents."""
    if not documents or not read_tokens:
        return []
    cut = _cut(tokenizer, documents, read_tokens)
    starts = [sum(len(text) + 2 for text in cut[:number]) for number in range(len(cut))]
    text = "\n\n".join(cut) + "\n\n"
    if len(cut) == 1:
        return [tokenizer(text).input_ids]
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} cannot say where each token starts (a slow tokenizer): load the "
                         "LM's fast tokenizer (AutoTokenizer, use_fast=True) to read documents in parts")
    encoded = tokenizer(text, return_offsets_mapping=True)
    parts: list[list[int]] = [[] for _ in cut]
    for token, (start, _) in zip(encoded.input_ids, encoded.offset_mapping):
        parts[max(0, bisect.bisect_right(starts, start) - 1)].append(token)
    return parts


class DocumentReader:
    """A request's documents, read for ``model`` under ``config``."""

    def __init__(self, model: DynamicVocabLM, config: PipelineConfig | None = None) -> None:
        self.model, self.config = model, config or PipelineConfig()

    def candidates(self, documents: list[dict]) -> list[Phrase]:
        """Phrases of ``documents`` that the model's phrase table accepts, best first."""
        c = self.config
        if not c.max_phrases:  # the bare LM's vocabulary: nothing to cut
            return []
        found = extract_phrases(  # a few spares: a phrase whose text re-tokenizes too long is dropped below
            documents, self.model.tokenizer, unit=c.unit, min_length=c.min_length, max_length=c.max_length,
            min_count=c.min_count, max_phrases=c.max_phrases + c.max_phrases // 8 + 8, edges=c.edges, ranking=c.ranking,
        )
        table = self.model.phrase_table  # its tokenize remembers the ids for set_phrases and the context gate
        kept = tokenized_phrases(found, self.model.tokenizer, table.max_phrase_tokens, table.tokenize)
        return [phrase for phrase, _ in kept][: c.max_phrases]

    def phrase_contexts(self, documents: list[dict], phrases: Sequence[Phrase]) -> dict | None:
        """With ``config.context_tokens``, where each of ``phrases`` follows in ``documents`` (``generate``'s
        ``phrase_contexts`` for one prompt, ``dynvocab.decoding.context_gate``); None when the gate is off."""
        n, tokenizer = self.config.context_tokens, self.model.tokenizer
        if not n:
            return None
        if not phrases:
            return {}
        return document_contexts(documents, tokenizer, self.model.phrase_table.tokenize([p.text for p in phrases]), n)

    def read(self, documents: list[dict]) -> list[dict]:
        """The documents the LM reads in grounded decoding: the top ``config.read_documents``."""
        return documents[: self.config.read_documents]

    def context_ids(self, documents: list[dict]) -> list[int]:
        """What the LM reads before the prompt: ``read(documents)``, each cut to ``config.read_tokens`` tokens, joined
        and followed by blank lines, as token ids ([] when there is nothing to read)."""
        return in_context_ids(self.model.tokenizer, self.read(documents), self.config.read_tokens)

    def context_parts(self, documents: list[dict], stored: int) -> list[list[int]]:
        """``context_ids`` cut where each read document starts (``document_context_ids``) when the first ``stored``
        come as keys and values read once, else whole (one part; none when there is nothing to read)."""
        if stored:
            return document_context_ids(self.model.tokenizer, self.read(documents), self.config.read_tokens)
        return [ids] if (ids := self.context_ids(documents)) else []

    def citations(self, documents: list[dict], new: list[int]) -> list[Citation]:
        """The spans of a continuation (its new mixed ids ``new``) that stand in the ``documents`` the LM read
        (``read(documents)``), each with the position of its document among them."""
        model = self.model
        tokens = [t for t in model.phrase_table.spell(new) if t not in model.tokenizer.all_special_ids]
        return cite(tokens, [d["text"] for d in self.read(documents)], model.tokenizer, self.config.cite_tokens)

    def drafter(self, documents: list[dict], corpus: CorpusDrafts | None = None) -> DocumentDrafter:
        """Drafts of ``config.draft_tokens`` tokens from ``documents`` and the text so far, for one prompt, and of
        ``config.fill_tokens`` from ``corpus`` where those have none."""
        c, texts = self.config, [d["text"] for d in documents]
        cost = c.draft_step_cost
        if cost is None:  # drafts cannot change the text (PipelineConfig.drafts_keep_the_text): measured once per model and draft length
            costs = _DRAFT_STEP_COSTS.setdefault(self.model, {})
            if c.draft_tokens not in costs:
                costs[c.draft_tokens] = draft_step_cost(self.model, c.draft_tokens)
                logger.info("a forward call over a token and %d drafted ones costs %.2fx a one-token call here",
                            c.draft_tokens, 1 + costs[c.draft_tokens])
            cost = costs[c.draft_tokens]
        return DocumentDrafter(self.model.tokenizer(texts, add_special_tokens=False).input_ids if texts else [],
                               c.draft_tokens, no_repeat_ngram_size=c.no_repeat_ngram_size, step_cost=cost,
                               corpus=corpus if c.fill_tokens else None, fill_tokens=c.fill_tokens)
