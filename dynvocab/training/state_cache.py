"""The frozen LM's states over the training text, computed once and streamed from disk.

With token read-back a decoded phrase is fed back as its tokens, so the state that scores
the next item is the LM's own state over the plain text. With a frozen LM that state is
the same at every epoch: one forward pass over the corpus stores it, and a training step
then runs only the phrase encoder (``dynvocab.training.cached_loss``). Besides the last
hidden state, each position keeps the two numbers of the LM's own distribution the loss
needs: the log-sum-exp of its ``V`` logits, the logit of the token that follows and the
largest logit.

A cache folder holds::

    cache_config.json   the key (LM, tokenizer, corpus, chunking) and the sizes; "complete" once every shard is in
    texts.jsonl         the corpus texts, so training needs nothing else
    chunks.npy          (N, 4) int64: text index, first token, end token, offset of the chunk's first position
    tokens.npy          (T,) int32: the chunks' token ids, back to back
    hidden.npy          (T, d) uint16 bfloat16 bits (or float32): the LM's last hidden state at every position
    token_stats.npy     (T, 3) float32: logsumexp of the V logits, the logit of the next token (NaN at a chunk end), the largest logit
    done/shard-K        one marker per finished shard: a build that stops resumes after the last one

The arrays are memory-mapped, so a cache larger than memory trains at the speed of the
page cache. Under ``accelerate launch`` each process writes its own shards (shard ``K``
goes to process ``K mod N``), into disjoint rows of the same files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..hardware.precision import cpu_processes
from ..io.fingerprints import lm_fingerprint
from ..serialization import tokenizer_fingerprint
from ..tokens.padding import pad_sequences
from .samples import chunk_bounds

__all__ = ["CACHE_CONFIG", "CACHE_FORMAT", "StateCache", "StaleCacheError", "build_state_cache", "cache_key"]

logger = logging.getLogger(__name__)

CACHE_CONFIG = "cache_config.json"
CACHE_FORMAT = 1
_DTYPES = {"bfloat16": np.uint16, "float32": np.float32}


class StaleCacheError(ValueError):
    """A cache built for another LM, tokenizer, corpus or chunking than the one asked for."""


def cache_key(lm: torch.nn.Module, tokenizer, texts: Sequence[str], max_length: int, dtype: str) -> dict:
    """What a cache's states depend on; two builds with equal keys write equal files."""
    corpus = hashlib.sha256()
    for text in texts:
        corpus.update(text.encode("utf-8", "surrogatepass"))
        corpus.update(b"\0")
    return {
        "format": CACHE_FORMAT, "lm": lm_fingerprint(lm), "tokenizer": tokenizer_fingerprint(tokenizer),
        "corpus": corpus.hexdigest()[:16], "texts": len(texts), "max_length": max_length, "dtype": dtype,
    }


@dataclass
class StateCache:
    """A cache, memory-mapped. ``chunks[i]`` is ``(text, first token, end token, offset)``; ``available[i]`` says
    whether chunk ``i``'s states are written (all of them in a complete cache)."""

    directory: Path
    key: dict
    texts: list[str]
    chunks: np.ndarray
    tokens: np.ndarray
    hidden: np.ndarray
    token_stats: np.ndarray
    available: np.ndarray

    @classmethod
    def open(
        cls, directory: str | os.PathLike, expected_key: dict | None = None, rebuild_hint: str = "",
        allow_incomplete: bool = False,
    ) -> "StateCache":
        """Open a cache; one whose key differs from ``expected_key`` is refused with ``rebuild_hint``.

        An incomplete one (its build stopped, or still runs in another process) is refused unless
        ``allow_incomplete``: then only the chunks of its finished shards are ``available``.
        """
        directory = Path(directory)
        config_path = directory / CACHE_CONFIG
        if not config_path.is_file():
            raise FileNotFoundError(f"{directory} holds no state cache ({CACHE_CONFIG} is missing); build it: {rebuild_hint}")
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if expected_key is not None:
            _check_key(config["key"], expected_key, directory, rebuild_hint)
        if not config.get("complete") and not allow_incomplete:
            raise ValueError(f"the state cache {directory} is not complete (its build stopped); resume it: {rebuild_hint}")
        texts = [json.loads(line)["text"] for line in (directory / "texts.jsonl").read_text(encoding="utf-8").splitlines()]
        chunks = np.load(directory / "chunks.npy")
        available = np.ones(len(chunks), dtype=bool)
        if not config.get("complete"):
            shard = np.arange(len(chunks)) // config["shard_chunks"]
            done = [k for k in range(config["shards"]) if (directory / "done" / f"shard-{k}").exists()]
            available = np.isin(shard, done)
            logger.warning("the state cache %s is incomplete: training on the %d of %d chunks whose states are written",
                           directory, int(available.sum()), len(chunks))
        return cls(
            directory, config["key"], texts, chunks, np.load(directory / "tokens.npy", mmap_mode="r"),
            np.load(directory / "hidden.npy", mmap_mode="r"), np.load(directory / "token_stats.npy", mmap_mode="r"),
            available,
        )

    def __len__(self) -> int:
        return len(self.chunks)

    def chunk_tokens(self, index: int) -> list[int]:
        _, begin, end, offset = self.chunks[index]
        return self.tokens[offset : offset + end - begin].tolist()

    def states(self, indices: Sequence[int], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded states of chunks ``indices``: hidden ``(B, T, d)`` float32 and stats ``(B, T, 3)`` float32."""
        lengths = [int(self.chunks[i, 2] - self.chunks[i, 1]) for i in indices]
        width, size = max(lengths), self.hidden.shape[1]
        hidden = torch.zeros(len(indices), width, size, dtype=torch.float32)
        stats = torch.zeros(len(indices), width, 3, dtype=torch.float32)
        for row, (index, length) in enumerate(zip(indices, lengths)):
            offset = int(self.chunks[index, 3])
            hidden[row, :length] = _as_float(np.asarray(self.hidden[offset : offset + length]), self.key["dtype"])
            stats[row, :length] = torch.from_numpy(np.array(self.token_stats[offset : offset + length]))
        return hidden.to(device), stats.to(device)


def _as_float(array: np.ndarray, dtype: str) -> torch.Tensor:
    tensor = torch.from_numpy(np.array(array))
    return tensor.view(torch.bfloat16).float() if dtype == "bfloat16" else tensor


def _check_key(found: dict, expected: dict, directory: Path, rebuild_hint: str) -> None:
    differ = sorted(k for k in set(found) | set(expected) if found.get(k) != expected.get(k))
    if differ:
        what = ", ".join(f"{k} {found.get(k)!r} (wanted {expected.get(k)!r})" for k in differ)
        raise StaleCacheError(
            f"the state cache {directory} was built for another setting: {what}; states of another LM, tokenizer, "
            f"corpus or chunking would train the encoder on wrong targets. Rebuild it into a new folder: {rebuild_hint}"
        )


def _chunks_of(texts: Sequence[str], tokenizer, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunks as training cuts them (``chunk_bounds``, word-aligned where the tokenizer gives offsets)."""
    fast = getattr(tokenizer, "is_fast", False)
    rows, tokens, offset = [], [], 0
    for start in range(0, len(texts), 256):
        batch = list(texts[start : start + 256])
        encoded = tokenizer(batch, add_special_tokens=False, return_offsets_mapping=fast, verbose=False)
        for i, text in enumerate(batch):
            ids = encoded["input_ids"][i]
            offsets = [tuple(o) for o in encoded["offset_mapping"][i]] if fast else None
            for begin, end in chunk_bounds(len(ids), max_length, text if fast else None, offsets):
                if end - begin < 2:
                    continue
                rows.append((start + i, begin, end, offset))
                tokens.extend(ids[begin:end])
                offset += end - begin
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4), np.asarray(tokens, dtype=np.int32)


def build_state_cache(
    lm: torch.nn.Module,
    tokenizer,
    texts: Sequence[str],
    directory: str | os.PathLike,
    max_length: int = 128,
    batch_size: int = 8,
    shard_chunks: int = 256,
    dtype: str = "bfloat16",
    rebuild_hint: str = "",
    stop_after_shards: int | None = None,
) -> Path:
    """Write (or resume) the state cache of ``texts`` under ``lm`` into ``directory``; returns the folder.

    A folder holding a cache of another key is refused (:class:`StaleCacheError`). Under
    ``accelerate launch`` every process calls this and writes its own shards.
    The LM runs on the process's device (``PartialState().device``: its GPU where there is one) and is put
    back where it was afterwards. ``stop_after_shards`` ends this call early (as an interruption would): for tests.
    """
    from accelerate import PartialState

    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r}; choose one of {sorted(_DTYPES)}")
    if not texts:
        raise ValueError("the corpus holds no text; pass the texts to cache")
    state = PartialState(cpu=cpu_processes())  # without cpu=True, CPU processes would each run alone and race
    directory = Path(directory)
    key = cache_key(lm, tokenizer, texts, max_length, dtype)
    config_path = directory / CACHE_CONFIG
    if state.is_main_process:
        if config_path.is_file():
            _check_key(json.loads(config_path.read_text(encoding="utf-8"))["key"], key, directory, rebuild_hint)
        else:
            _start(directory, lm, tokenizer, texts, max_length, dtype, key, shard_chunks)
    state.wait_for_everyone()
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("complete"):
        return directory
    chunks = np.load(directory / "chunks.npy")
    tokens = np.load(directory / "tokens.npy", mmap_mode="r")
    hidden = np.load(directory / "hidden.npy", mmap_mode="r+")
    stats = np.load(directory / "token_stats.npy", mmap_mode="r+")
    shards = [k for k in range(config["shards"]) if k % state.num_processes == state.process_index]
    todo = [k for k in shards if not (directory / "done" / f"shard-{k}").exists()]
    home, device = next(lm.parameters()).device, state.device  # the LM runs on this process's accelerator
    was_training = lm.training
    lm.eval().to(device)
    bar = tqdm(total=len(shards), initial=len(shards) - len(todo), desc="caching LM states", unit="shard",
               disable=not state.is_local_main_process)
    for count, shard in enumerate(todo):
        if stop_after_shards is not None and count == stop_after_shards:
            break
        rows = chunks[shard * config["shard_chunks"] : (shard + 1) * config["shard_chunks"]]
        _write_shard(lm, rows, tokens, hidden, stats, batch_size, device, dtype)
        hidden.flush()
        stats.flush()
        marker = directory / "done" / f"shard-{shard}"
        marker.with_suffix(".partial").write_text(f"process {state.process_index}\n", encoding="utf-8")  # who wrote it
        os.replace(marker.with_suffix(".partial"), marker)
        bar.update()
    bar.close()
    lm.train(was_training).to(home)
    state.wait_for_everyone()
    if state.is_main_process and all((directory / "done" / f"shard-{k}").exists() for k in range(config["shards"])):
        _write_config(directory, config | {"complete": True})
    state.wait_for_everyone()
    return directory


def _start(directory: Path, lm, tokenizer, texts, max_length: int, dtype: str, key: dict, shard_chunks: int) -> None:
    """Chunk the corpus and allocate the arrays; the config, written last, marks the folder as a cache."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "done").mkdir(exist_ok=True)
    chunks, tokens = _chunks_of(texts, tokenizer, max_length)
    if not len(chunks):
        raise ValueError("the corpus yields no chunk of 2 tokens or more; pass longer texts")
    with open(directory / "texts.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    np.save(directory / "chunks.npy", chunks)
    np.save(directory / "tokens.npy", tokens)
    size = lm.get_input_embeddings().embedding_dim
    np.lib.format.open_memmap(directory / "hidden.npy", mode="w+", dtype=_DTYPES[dtype], shape=(len(tokens), size)).flush()
    np.lib.format.open_memmap(directory / "token_stats.npy", mode="w+", dtype=np.float32, shape=(len(tokens), 3)).flush()
    config = {"key": key, "chunks": len(chunks), "positions": len(tokens), "hidden_size": size,
              "shard_chunks": shard_chunks, "shards": -(-len(chunks) // shard_chunks), "complete": False}
    _write_config(directory, config)


def _write_config(directory: Path, config: dict) -> None:
    partial = directory / f".{CACHE_CONFIG}.partial"
    partial.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, directory / CACHE_CONFIG)


@torch.no_grad()
def _write_shard(lm, rows: np.ndarray, tokens, hidden, stats, batch_size: int, device, dtype: str) -> None:
    """Run the LM over one shard's chunks (longest first, little padding) and write their states in place."""
    order = sorted(range(len(rows)), key=lambda i: rows[i, 1] - rows[i, 2])
    for start in range(0, len(order), batch_size):
        batch = rows[order[start : start + batch_size]]
        sequences = [tokens[offset : offset + end - begin].tolist() for _, begin, end, offset in batch]
        ids, mask = pad_sequences(sequences, device=device)
        out = lm(input_ids=ids, attention_mask=mask, output_hidden_states=True, return_dict=True)
        logits = out.logits.float()
        lse, top = logits.logsumexp(-1), logits.max(-1).values
        following = logits[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
        following = torch.cat([following, torch.full_like(following[:, :1], float("nan"))], dim=1)
        # one copy to the host per batch, not per row
        last = out.hidden_states[-1].to(torch.bfloat16 if dtype == "bfloat16" else torch.float32).cpu()
        lse, following, top = lse.cpu(), following.cpu(), top.cpu()
        for row, (_, begin, end, offset) in enumerate(batch):
            length = int(end - begin)
            following[row, length - 1] = float("nan")
            states = last[row, :length]
            hidden[offset : offset + length] = states.view(torch.uint16).numpy() if dtype == "bfloat16" else states.numpy()
            stats[offset : offset + length, 0] = lse[row, :length].numpy()
            stats[offset : offset + length, 1] = following[row, :length].numpy()
            stats[offset : offset + length, 2] = top[row, :length].numpy()
