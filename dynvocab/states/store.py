"""The frozen LM's states over documents, computed once and read from disk: state keys beside the index.

The state gate (``dynvocab.states.keys``) keys a phrase by the LM's states before the places it starts in a
request's documents. Reading those documents costs one LM pass over them (1.8 s for 8 new Wikipedia leads in the
server on 2 CPU cores), though the same documents come back request after request, and after every restart.
:func:`write_document_states` reads every document of an index once and keeps its states on disk;
:class:`DocumentStateStore` memory-maps them, and ``DocumentStates.use_store`` reads them there before asking the LM.
A store is tied to one LM's weights (:func:`dynvocab.io.fingerprints.lm_fingerprint`) and to the number of tokens
kept of a document.

Layout of a store folder::

    store.json          format, LM fingerprint, max_tokens, dim, dtype and what the builder recorded
    shard-00000/        one shard of documents, written atomically (``dynvocab.io.atomic``)
        token_ids.npy   (sum of lengths,) int32: each document's first max_tokens token ids, one after the other
        offsets.npy     (n + 1,) int64: document i is token_ids[offsets[i]:offsets[i + 1]]
        states.npy      (sum of lengths, d) float16 or float32: the LM's last normed state at each of those tokens
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..io.fingerprints import lm_fingerprint
from ..phrases.store import (
    StoreKind,
    finished_shards,
    flatten,
    phrase_keys,
    read_record,
    shard_path,
    start_or_resume,
    write_token_shard,
)

__all__ = ["DOCUMENT_STATES", "DocumentStateStore", "DocumentStates", "write_document_states"]

logger = logging.getLogger(__name__)

DOCUMENT_STATES = StoreKind("dynvocab.DocumentStateStore", "document states",
                            "dynvocab document-states --index <index folder>")
#: the dtypes states are kept in on disk
DTYPES = {"float16": np.float16, "float32": np.float32}


class DocumentStateStore:
    """The LM's states over documents, by their token ids, read from a store folder's memory-mapped shards.

    Memory holds each document's token ids and a 64-bit key; a document is found by its key and its ids compared,
    so a key collision is a miss, never another document's states.
    """

    #: the kind of store folder this class opens
    kind: StoreKind = DOCUMENT_STATES

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.record = read_record(self.directory, self.kind)
        self.fingerprint: str = self.record["fingerprint"]
        self.max_tokens, self.dim = int(self.record["max_tokens"]), int(self.record["dim"])
        self._ids, self._offsets, self._states = [], [], []
        self._where: dict[int, list[tuple[int, int]]] = {}  # key -> (shard, document) of each document with it
        for number in finished_shards(self.directory):
            path = shard_path(self.directory, number)
            flat, offsets = np.load(path / "token_ids.npy"), np.load(path / "offsets.npy")
            states = np.load(path / "states.npy", mmap_mode="r")
            if states.shape != (int(offsets[-1]), self.dim):
                raise ValueError(f"{path}/states.npy has shape {states.shape}, not ({int(offsets[-1])}, {self.dim}); "
                                 f"rebuild the store with `{self.kind.command} --overwrite`")
            shard = len(self._states)
            for document, key in enumerate(phrase_keys(flat, offsets).tolist()):
                self._where.setdefault(key, []).append((shard, document))
            self._ids.append(flat)
            self._offsets.append(offsets)
            self._states.append(states)
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return sum(len(offsets) - 1 for offsets in self._offsets)

    @property
    def tokens(self) -> int:
        return sum(int(offsets[-1]) for offsets in self._offsets)

    @property
    def disk_bytes(self) -> int:
        return sum(states.nbytes for states in self._states)

    @property
    def resident_bytes(self) -> int:
        """Bytes of the token ids and offsets held in memory (the states stay on disk, paged in as read)."""
        return sum(a.nbytes for a in self._ids + self._offsets)

    def lookup(self, documents: Sequence[Sequence[int]]) -> list[torch.Tensor | None]:
        """Each document's ``(L_i, d)`` float32 states, or None where the store does not hold exactly those ids."""
        found: list[torch.Tensor | None] = [None] * len(documents)
        filled = [i for i, ids in enumerate(documents) if len(ids)]  # an empty document has no states
        keys = phrase_keys(*flatten([documents[i] for i in filled])).tolist() if filled else []
        for i, key in zip(filled, keys):
            place = next(((s, d) for s, d in self._where.get(key, ()) if self._holds(s, d, documents[i])), None)
            if place is not None:
                shard, document = place
                start, end = self._offsets[shard][document : document + 2]
                found[i] = torch.from_numpy(np.array(self._states[shard][start:end], dtype=np.float32))
        hits = sum(states is not None for states in found)
        self.hits, self.misses = self.hits + hits, self.misses + len(found) - hits
        return found

    def _holds(self, shard: int, document: int, ids: Sequence[int]) -> bool:
        start, end = self._offsets[shard][document : document + 2]
        return end - start == len(ids) and bool(np.array_equal(self._ids[shard][start:end], np.asarray(ids)))

    def stats(self) -> dict[str, float]:
        """Documents and tokens held, hits, misses, and the bytes in memory and on disk."""
        return {"documents": len(self), "tokens": self.tokens, "hits": self.hits, "misses": self.misses,
                "resident_bytes": self.resident_bytes, "disk_bytes": self.disk_bytes}


class DocumentStates:
    """The frozen LM's last normed states over documents' first ``max_tokens`` tokens, each document read once.

    Kept by the documents' token ids, least recently used out first beyond ``max_bytes``: documents retrieved for
    many prompts (a domain's few licences, a popular lead) are read by the LM once, not once per request. With
    stores (``use_store``) a document is read from disk before the LM is asked. The states belong to the LM as it
    is: make a new one when its weights change. A subclass keeps other per-token states (``_read``, ``dim``) in
    stores of its own ``kind`` (``dynvocab.states.kv.DocumentKV``: the keys and values of every layer).
    """

    #: the stores this kind of states is kept in
    kind: StoreKind = DOCUMENT_STATES
    store_class: type[DocumentStateStore] = DocumentStateStore

    def __init__(self, lm: nn.Module, max_tokens: int = 512, batch_size: int = 8, max_bytes: int = 2**30) -> None:
        if max_tokens < 2 or batch_size < 1 or max_bytes < 0:
            raise ValueError(f"max_tokens={max_tokens} must be >= 2, batch_size={batch_size} >= 1 and "
                             f"max_bytes={max_bytes} >= 0")
        self._lm = weakref.ref(lm)  # held weakly: a registry keyed by the LM (the pipeline's) can let both go
        self.max_tokens, self.batch_size, self.max_bytes = max_tokens, batch_size, max_bytes
        self._kept: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self.stores: list[DocumentStateStore] = []
        #: folders of stores refused (another LM or max_tokens): not opened again
        self.refused: set[Path] = set()
        self._fingerprint: str | None = None
        #: documents found in memory, read from the store, and read by the LM
        self.bytes = self.hits = self.loaded = self.misses = 0

    @property
    def lm(self) -> nn.Module:
        lm = self._lm()
        if lm is None:
            raise RuntimeError("the LM of these document states was deleted; make a DocumentStates for the LM in use")
        return lm

    @property
    def dim(self) -> int:
        """Numbers kept per token: the LM's hidden size."""
        return self.lm.get_output_embeddings().weight.shape[1]

    @property
    def fingerprint(self) -> str:
        """The LM's :func:`~dynvocab.io.fingerprints.lm_fingerprint`, hashed once."""
        if self._fingerprint is None:
            self._fingerprint = lm_fingerprint(self.lm)
        return self._fingerprint

    def use_store(self, store: DocumentStateStore | str | Path | None) -> None:
        """Also read documents' states from ``store`` (a :class:`DocumentStateStore` or its folder) before reading
        them with the LM; None forgets every store. A store that another LM made, or with another ``max_tokens``, is
        refused."""
        if store is None:
            self.stores = []
            return
        store = store if isinstance(store, self.store_class) else self.store_class(store)
        if store.fingerprint != self.fingerprint or store.max_tokens != self.max_tokens:
            self.refused.add(store.directory)
            raise ValueError(
                f"the {self.kind.what} in {store.directory} were computed by another LM or for max_tokens="
                f"{store.max_tokens} (these: {self.max_tokens}); compute them again for this LM with "
                f"`{self.kind.command} --overwrite`"
            )
        if all(kept.directory != store.directory for kept in self.stores):
            self.stores.append(store)

    @torch.no_grad()
    def __call__(self, documents: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """``(L_i, d)`` states of each document (``L_i``: its first ``max_tokens`` tokens); unseen ones are read from
        the stores, else by the LM in right-padded batches of similar lengths."""
        texts = [tuple(ids[: self.max_tokens]) for ids in documents]
        found = {text: self._kept[text] for text in texts if text in self._kept}
        for text in found:
            self._kept.move_to_end(text)
        # read by length, so a batch pads little: on 32 Wikipedia leads, 1.24x the real tokens instead of 1.70x
        missing = sorted(dict.fromkeys(text for text in texts if text not in found), key=len)
        self.hits += len(texts) - len(missing)
        device = next(self.lm.parameters()).device
        for store in self.stores if missing else ():
            for text, stored in zip(missing, store.lookup(missing)):
                if stored is not None:
                    found[text] = self._keep(text, stored.to(device))
            self.loaded += sum(text in found for text in missing)
            missing = [text for text in missing if text not in found]
        self.misses += len(missing)
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start : start + self.batch_size]
            width = max(map(len, chunk))
            ids = torch.tensor([text + (0,) * (width - len(text)) for text in chunk], device=device)
            mask = torch.tensor([[1] * len(text) + [0] * (width - len(text)) for text in chunk], device=device)
            states = self._read(ids, mask)  # pads come last
            for row, text in enumerate(chunk):
                found[text] = self._keep(text, states[row, : len(text)].clone())
        return [found[text] for text in texts]

    def _read(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The ``(B, W, dim)`` float states at each of right-padded ``ids`` ``(B, W)`` (``mask`` 1 on real tokens): the
        LM's last normed state, what the output layer reads (no logits)."""
        return self.lm.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state.float()

    def _keep(self, text: tuple[int, ...], states: torch.Tensor) -> torch.Tensor:
        size = states.numel() * states.element_size()
        if size <= self.max_bytes:
            self._kept[text] = states
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, dropped = self._kept.popitem(last=False)
                self.bytes -= dropped.numel() * dropped.element_size()
        return states


def write_document_states(
    states: DocumentStates,
    documents: Sequence[Sequence[int]],
    directory: str | Path,
    record: dict[str, Any] | None = None,
    dtype: str = "float16",
    shard_documents: int = 256,
    overwrite: bool = False,
    show_progress_bar: bool | None = None,
) -> DocumentStateStore:
    """Read ``documents`` (token ids) with ``states`` (its LM, batch size and ``max_tokens``) and keep their states
    in ``directory``, a shard of ``shard_documents`` documents at a time: an interrupted build resumes at its first
    unfinished shard. ``record`` adds what the caller wants recorded (the documents' fingerprint, say); a store
    there with another record is refused unless ``overwrite``."""
    if dtype not in DTYPES or shard_documents < 1:
        raise ValueError(f"dtype={dtype!r} must be one of {sorted(DTYPES)} and shard_documents={shard_documents} >= 1")
    directory = Path(directory)
    record = {"fingerprint": states.fingerprint, "max_tokens": states.max_tokens,
              "dim": states.dim, "dtype": dtype, "shard_documents": shard_documents,
              **(record or {})}
    start_or_resume(directory, record, overwrite, states.kind)
    done = set(finished_shards(directory))
    shards = -(-len(documents) // shard_documents)
    show = shards > 1 if show_progress_bar is None else show_progress_bar
    for number in tqdm(range(shards), desc=states.kind.what, unit="shard", disable=not show):
        if number in done:
            continue
        shard = documents[number * shard_documents : (number + 1) * shard_documents]
        texts = [list(ids[: states.max_tokens]) for ids in shard if len(ids)]  # an empty document has no state
        read = states(texts)
        stacked = torch.cat(read).cpu().numpy() if read else np.zeros((0, record["dim"]), dtype=np.float32)
        if dtype == "float16" and np.abs(stacked).max(initial=0.0) > np.finfo(np.float16).max:
            raise ValueError(f"a state of shard {number} does not fit float16; build the store with dtype='float32' "
                             "(--dtype float32)")
        write_token_shard(directory, number, texts, {"states.npy": stacked.astype(DTYPES[dtype])})
    store = states.store_class(directory)
    logger.info("%s: %d documents, %d tokens in %s", states.kind.what, len(store), store.tokens, directory)
    return store
