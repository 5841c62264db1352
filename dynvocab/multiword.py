"""The MWT baseline (Gee et al., 2024): a *static* vocabulary of frequent multi-word n-grams.

The top-K most frequent whole-word n-grams of a training corpus become new tokens of
the LM (ids ``V .. V+K-1``), each embedding initialised as the mean of its pieces'
embeddings and then trained. Text is tokenized as usual, and a run of tokens that
spells an n-gram and starts and ends on word boundaries merges into that n-gram's id,
longest first. Unlike a dynamic vocabulary the set is the same for every prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .io.atomic import atomic_directory, recover, verify
from .serialization import tokenizer_fingerprint
from .tokens.ngrams import mine_ngrams, word_boundaries, word_start_flags
from .tokens.segmentation import forward_max_match

__all__ = ["CONFIG_NAME", "MultiWordLM", "MultiWordVocab", "WEIGHTS_NAME"]

CONFIG_NAME = "multiword_vocab.json"
WEIGHTS_NAME = "multiword_embeddings.safetensors"


class MultiWordVocab:
    """N-grams of token ids that act as single tokens ``vocab_size + i``.

    Args:
        tokenizer: the LM's tokenizer.
        ngrams: token-id tuples of 2+ tokens; the i-th becomes id ``vocab_size + i``.
        vocab_size: V, the LM's embedding rows before the n-grams are added.
    """

    def __init__(self, tokenizer, ngrams: Iterable[Sequence[int]], vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.ngrams = [tuple(int(t) for t in gram) for gram in ngrams]
        for gram in self.ngrams:
            if len(gram) < 2 or min(gram) < 0 or max(gram) >= vocab_size:
                raise ValueError(f"n-gram {gram} must have 2+ token ids in [0, {vocab_size}); mine it with this tokenizer")
        self._index = {gram: i for i, gram in enumerate(self.ngrams)}
        if len(self._index) < len(self.ngrams):
            raise ValueError("the n-grams contain duplicates; pass each n-gram once")
        self._longest = max(map(len, self.ngrams), default=2)
        self._flags = word_start_flags(tokenizer)

    @classmethod
    def mine(
        cls, texts: Iterable[str], tokenizer, vocab_size: int, num_ngrams: int = 5000, min_count: int = 5,
        max_tokens: int = 8,
    ) -> "MultiWordVocab":
        """The ``num_ngrams`` most frequent whole-word n-grams (2..``max_tokens`` tokens) of ``texts`` that span two
        or more whitespace-separated pieces: words, or a word and punctuation such as ``", and"``."""
        ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        found = mine_ngrams(ids, min_n=2, max_n=max_tokens, min_count=min_count, tokenizer=tokenizer)
        multiword = [gram for gram in found if len(tokenizer.decode(gram).split()) >= 2]
        return cls(tokenizer, multiword[:num_ngrams], vocab_size)

    def __len__(self) -> int:
        return len(self.ngrams)

    def merge(self, token_ids: Sequence[int]) -> list[int]:
        """Base token ids -> ids with every n-gram on word boundaries merged (longest first)."""
        if not self.ngrams or len(token_ids) < 2:
            return list(token_ids)
        boundaries = word_boundaries(np.asarray(token_ids, dtype=np.int64), self._flags)
        spans = forward_max_match(token_ids, self._index.get, self._longest, boundaries)
        return [token_ids[start] if index is None else self.vocab_size + index for start, _, index in spans]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.merge(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def expand(self, ids: Sequence[int]) -> list[int]:
        """Ids with n-grams -> the base token ids they stand for."""
        out: list[int] = []
        for i in (int(i) for i in ids):
            if i < self.vocab_size:
                out.append(i)
            elif i - self.vocab_size < len(self.ngrams):
                out.extend(self.ngrams[i - self.vocab_size])
            else:
                raise ValueError(f"id {i} is past the vocabulary: V={self.vocab_size} plus {len(self)} n-grams")
        return out

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return self.tokenizer.decode(self.expand(ids), skip_special_tokens=skip_special_tokens)


class MultiWordLM:
    """A causal LM whose embeddings were grown by a :class:`MultiWordVocab` (see ``from_causal_lm``)."""

    def __init__(self, lm: nn.Module, vocab: MultiWordVocab) -> None:
        rows = lm.get_input_embeddings().num_embeddings
        if rows != vocab.vocab_size + len(vocab):
            raise ValueError(f"the LM has {rows} embedding rows, the vocabulary needs {vocab.vocab_size + len(vocab)}")
        self.lm, self.vocab = lm, vocab

    @staticmethod
    def embedding_matrices(lm: nn.Module) -> list[nn.Parameter]:
        """The input embedding matrix, and the output one when it is not tied to it."""
        matrices = [lm.get_input_embeddings().weight]
        output = lm.get_output_embeddings()
        if output is not None and output.weight is not matrices[0]:
            matrices.append(output.weight)
        return matrices

    @classmethod
    @torch.no_grad()
    def from_causal_lm(cls, lm: nn.Module, vocab: MultiWordVocab) -> "MultiWordLM":
        """Grow ``lm``'s embeddings in place by ``vocab``'s n-grams, each row the mean of its pieces' rows."""
        if lm.get_input_embeddings().num_embeddings != vocab.vocab_size:
            raise ValueError(
                f"the vocabulary was built for V={vocab.vocab_size} but the LM has "
                f"{lm.get_input_embeddings().num_embeddings} rows; pass the LM it was mined for"
            )
        lm.resize_token_embeddings(vocab.vocab_size + len(vocab), mean_resizing=False)
        V = vocab.vocab_size
        for matrix in cls.embedding_matrices(lm):
            for i, gram in enumerate(vocab.ngrams):  # K small row means: no (K, L, d) temporary
                matrix[V + i] = matrix[list(gram)].mean(0)
        return cls(lm, vocab)

    def save_pretrained(self, directory: str | Path, **metadata) -> None:
        """The n-grams (as ids and text), the new embedding rows and ``metadata``, swapped in whole; the LM is not written."""
        with atomic_directory(directory) as staging:
            self.write_files(staging, **metadata)

    def write_files(self, directory: Path, **metadata) -> None:
        """What :meth:`save_pretrained` saves, written into ``directory`` as it is (a staging folder)."""
        v = self.vocab
        matrices = self.embedding_matrices(self.lm)
        payload = {
            "base_model": getattr(self.lm.config, "name_or_path", None), "hidden_size": matrices[0].shape[1],
            "tied_embeddings": len(matrices) == 1,
            "vocab_size": v.vocab_size, "tokenizer_fingerprint": tokenizer_fingerprint(v.tokenizer),
            "ngrams": [list(g) for g in v.ngrams], "texts": [v.tokenizer.decode(g) for g in v.ngrams], **metadata,
        }
        rows = {name: m[v.vocab_size :].detach().float().cpu().contiguous() for name, m in zip(("input", "output"), matrices)}
        (directory / CONFIG_NAME).write_text(json.dumps(payload, indent=1) + "\n")
        save_file(rows, str(directory / WEIGHTS_NAME))

    @classmethod
    @torch.no_grad()
    def from_pretrained(cls, directory: str | Path, lm: nn.Module, tokenizer) -> "MultiWordLM":
        """Put a saved n-gram vocabulary and its trained rows onto the base ``lm`` it was trained on."""
        directory = Path(directory)
        recover(directory)
        if not (directory / CONFIG_NAME).exists():
            raise FileNotFoundError(f"{directory} has no {CONFIG_NAME}; pass a directory written by `dynvocab train-mwt`")
        verify(directory)
        saved = json.loads((directory / CONFIG_NAME).read_text())
        if saved["tokenizer_fingerprint"] != tokenizer_fingerprint(tokenizer):
            raise ValueError(f"{directory} was trained with another tokenizer; pass the base LM's own tokenizer")
        matrices = cls.embedding_matrices(lm)
        if (matrices[0].shape[1], len(matrices) == 1) != (saved["hidden_size"], saved["tied_embeddings"]):
            raise ValueError(
                f"{directory} was trained on {saved['base_model']} (hidden size {saved['hidden_size']}, tied embeddings: "
                f"{saved['tied_embeddings']}); load it onto that LM, or train one for this LM with `dynvocab train-mwt`"
            )
        model = cls.from_causal_lm(lm, MultiWordVocab(tokenizer, saved["ngrams"], saved["vocab_size"]))
        rows = load_file(str(directory / WEIGHTS_NAME))
        for name, matrix in zip(("input", "output"), cls.embedding_matrices(lm)):
            matrix[saved["vocab_size"] :] = rows[name].to(matrix)
        return model
