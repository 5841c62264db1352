"""A phrase vocabulary for docids, in the spirit of TokenMonster, and BPE/Unigram baselines of the same size.

Text is cut into pieces of one character class (a run of letters, a run of digits, or one
other character), each carrying the whitespace before it. Candidates respect those
boundaries: every whole piece, runs of 2 to ``max_pieces`` pieces and substrings of a piece
seen at least ``min_count`` times, plus every character seen, so any text can be encoded.
The vocabulary is then pruned in rounds: the docids are segmented into the fewest tokens
(dynamic programming over character positions), each candidate earns what it saves there
(``uses x (tokens its text takes without it - 1)``: for a token the rest cannot spell, that is
the characters it saves) and the lowest earners go until ``size`` are left.

``train_baseline`` trains the ``tokenizers`` library's BPE or Unigram on the same docids at the
same size (Metaspace pre-tokenisation: their tokens never cross a word).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from tqdm.auto import tqdm

from dynvocab.config import JsonConfig
from dynvocab.io.tensor_files import read_tensor_folder, write_tensor_folder

__all__ = [
    "SPECIAL_TOKENS", "DocidTokenizer", "HFDocidTokenizer", "PhraseVocabConfig", "PhraseVocabulary", "pieces",
    "train_baseline",
]

logger = logging.getLogger(__name__)

#: ids 0, 1, 2 in every docid tokenizer of this module
SPECIAL_TOKENS = ("[PAD]", "[END]", "[UNK]")
PAD_ID, END_ID, UNK_ID = 0, 1, 2
FORMAT = "dynvocab.PhraseVocabulary"
VOCAB_FILE = "vocab.json"
#: docids plus candidates from which the first segmentation shows progress bars
PROGRESS_FROM = 100_000
_PIECE = re.compile(r"\s*(?:[^\W\d_]+|\d+|[^\w\s]|_)|\s+")


def pieces(text: str) -> list[str]:
    """``text`` cut into single-class pieces, each with the whitespace before it; ``"".join`` gives ``text`` back."""
    return _PIECE.findall(text)


class DocidTokenizer(Protocol):
    """What the NAR retriever needs from a docid tokenizer: ids, and the pad and end ids."""

    pad_id: int
    end_id: int

    @property
    def vocab_size(self) -> int: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...


@dataclass
class PhraseVocabConfig(JsonConfig):
    """Settings of the phrase-vocabulary builder."""

    size: int = field(default=16384, metadata={"help": "Target vocabulary size, special tokens and characters included."})
    max_pieces: int = field(default=6, metadata={"help": "Longest candidate, in single-class pieces."})
    min_count: int = field(default=2, metadata={"help": "A multi-piece candidate must occur this often."})
    prune_fraction: float = field(default=0.2, metadata={"help": "Share of the excess dropped per pruning round."})

    config_name: ClassVar[str] = "phrase_vocab_config.json"

    def __post_init__(self) -> None:
        for name in ("size", "max_pieces", "min_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PhraseVocabConfig.{name}={value!r} must be an integer >= 1")
        if self.size <= len(SPECIAL_TOKENS):
            raise ValueError(f"PhraseVocabConfig.size={self.size} must exceed the {len(SPECIAL_TOKENS)} special tokens")
        if not 0.0 < self.prune_fraction <= 1.0:
            raise ValueError(f"PhraseVocabConfig.prune_fraction={self.prune_fraction} must be in (0, 1]; pass e.g. 0.2")


class PhraseVocabulary:
    """Special tokens, then every character seen, then phrases; encodes any text with the fewest tokens."""

    pad_id, end_id, unk_id = PAD_ID, END_ID, UNK_ID

    def __init__(self, tokens: Sequence[str], config: PhraseVocabConfig) -> None:
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS or len(set(tokens)) != len(tokens):
            raise ValueError(f"tokens must start with {SPECIAL_TOKENS} and hold each string once")
        self.tokens, self.config = list(tokens), config
        self.ids = {token: i for i, token in enumerate(self.tokens)}
        self._longest = max((len(pieces(t)) for t in self.tokens[len(SPECIAL_TOKENS) :]), default=1)  # in pieces

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @classmethod
    def train(cls, docids: Iterable[str], config: PhraseVocabConfig | None = None, show_progress_bar: bool = True
              ) -> "PhraseVocabulary":
        """Build the vocabulary from ``docids`` (read once; repeated docids count once per occurrence)."""
        config = config or PhraseVocabConfig()
        counts = Counter(docids)
        if not counts:
            raise ValueError("docids is empty; pass the docid strings to build the vocabulary from")
        bad = next((d for d in counts if not isinstance(d, str) or not d), None)
        if bad is not None:
            raise TypeError(f"every docid must be a non-empty str, got {bad!r}; convert docids to text first")
        split = {docid: pieces(docid) for docid in counts}
        characters = sorted({c for docid in counts for c in docid})
        candidates = _candidates(split, counts, config)
        base = [*SPECIAL_TOKENS, *characters]
        if len(base) > config.size:
            raise ValueError(f"size={config.size} is below the {len(base)} special tokens and characters the docids need; "
                             "raise size")
        phrases = [c for c in candidates if c not in set(characters)]
        kept = cls(base + phrases, config)._pruned(phrases, config.size - len(base), split, counts, show_progress_bar)
        return cls(base + kept, config)

    def _pruned(self, phrases: list[str], target: int, split: dict[str, list[str]], counts: Counter,
                show_progress_bar: bool) -> list[str]:
        """``phrases`` pruned in rounds to ``target``, dropping the lowest earners (this vocabulary loses them as it goes).

        Each docid's segmentation, and each phrase's spelling without itself, is computed once and again only
        when it used a dropped token: with fewer tokens a segmentation that is still possible stays the one the
        dynamic programme picks (its cost cannot fall, its ties break as before), so the result is the same as
        segmenting everything every round, and a round costs what the dropped tokens touched.
        """
        quiet = not show_progress_bar or len(split) + len(phrases) < PROGRESS_FROM
        segmented = _Segmentations(counts)
        for docid, parts in tqdm(split.items(), desc="segmenting docids", disable=quiet):
            segmented.set(docid, self._segment(parts))
        spelled = _Segmentations()  # each phrase's text without the phrase: len - 1 tokens saved per use
        for phrase in tqdm(phrases, desc="spelling phrases", disable=quiet):
            spelled.set(phrase, self._spelling_without(phrase))
        alive = list(phrases)
        bar = tqdm(total=max(len(alive) - target, 0), desc="pruning phrases", disable=not show_progress_bar)
        while len(alive) > target:
            uses = segmented.uses
            earn = {p: uses[p] * (len(spelled.tokens[p]) - 1) if uses[p] else 0 for p in alive}
            excess = len(alive) - target
            drop = min(excess, max(1000, math.ceil(self.config.prune_fraction * excess)))
            dropped = set(sorted(alive, key=lambda p: (earn[p], uses[p], p))[:drop])
            for phrase in dropped:
                del self.ids[phrase]
                spelled.remove(phrase)
            for docid in segmented.users_of(dropped):
                segmented.set(docid, self._segment(split[docid]))
            for phrase in spelled.users_of(dropped):
                spelled.set(phrase, self._spelling_without(phrase))
            alive = [p for p in alive if p not in dropped]
            bar.update(len(dropped))
        bar.close()
        return alive

    def _spelling_without(self, token: str) -> list[str]:
        """The fewest tokens that spell ``token``'s text when ``token`` itself is not in the vocabulary."""
        number = self.ids.pop(token)
        try:
            return self._segment(pieces(token))
        finally:
            self.ids[token] = number

    def _segment(self, parts: list[str]) -> list[str]:
        """Fewest tokens: a token is a substring of one piece or a run of whole pieces; any character is a
        token of its own. Dynamic programming over character positions; ties go to the longer first token."""
        text = "".join(parts)
        n = len(text)
        piece_end, piece_start = [0] * n, {}
        position = 0
        for number, part in enumerate(parts):
            piece_start[position] = number
            piece_end[position : position + len(part)] = [position + len(part)] * len(part)
            position += len(part)
        ends = [0] * (n + 1)
        offset = 0
        for number, part in enumerate(parts):
            offset += len(part)
            ends[number] = offset
        cost = [0] * (n + 1)
        step = [0] * (n + 1)
        for start in range(n - 1, -1, -1):
            best, best_end = 1 + cost[start + 1], start + 1
            first = piece_start.get(start)
            if first is not None:  # runs of two or more whole pieces, longest first
                for last in range(min(len(parts), first + self._longest) - 1, first, -1):
                    end = ends[last]
                    if 1 + cost[end] < best and text[start:end] in self.ids:
                        best, best_end = 1 + cost[end], end
            for end in range(piece_end[start], start + 1, -1):  # substrings of this piece, longest first
                if 1 + cost[end] < best and text[start:end] in self.ids:
                    best, best_end = 1 + cost[end], end
            cost[start], step[start] = best, best_end
        out, start = [], 0
        while start < n:
            out.append(text[start : step[start]])
            start = step[start]
        return out

    def encode(self, text: str) -> list[int]:
        """The fewest-token ids of ``text`` (without the end id); an unseen character is ``[UNK]``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return [self.ids.get(token, UNK_ID) for token in self._segment(pieces(text))]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.tokens[i] for i in ids if i >= len(SPECIAL_TOKENS))

    def save(self, directory: str | Path) -> Path:
        """Write the tokens (JSON, hashed) and the config into ``directory``, atomically."""
        content = json.dumps(self.tokens, ensure_ascii=False)
        return write_tensor_folder(directory, FORMAT, {}, {"config": self.config.to_dict()}, {VOCAB_FILE: content})

    @classmethod
    def load(cls, directory: str | Path) -> "PhraseVocabulary":
        manifest, _ = read_tensor_folder(directory, FORMAT)
        tokens = json.loads((Path(directory) / VOCAB_FILE).read_text(encoding="utf-8"))
        return cls(tokens, PhraseVocabConfig.from_dict(manifest["config"]))


class _Segmentations:
    """Texts' current segmentations, how often each token is used (a text counts ``weights[text]`` times, default
    once) and which texts use it, kept in step as texts are segmented again or removed."""

    def __init__(self, weights: Counter | None = None) -> None:
        self.weights = weights
        self.tokens: dict[str, list[str]] = {}
        self.uses: Counter = Counter()
        self._users: dict[str, set[str]] = {}

    def set(self, text: str, tokens: list[str]) -> None:
        self.remove(text)
        weight = 1 if self.weights is None else self.weights[text]
        self.tokens[text] = tokens
        for token in tokens:
            self.uses[token] += weight
            self._users.setdefault(token, set()).add(text)

    def remove(self, text: str) -> None:
        weight = 1 if self.weights is None else self.weights[text]
        for token in self.tokens.pop(text, ()):
            self.uses[token] -= weight
            self._users[token].discard(text)

    def users_of(self, tokens: set[str]) -> set[str]:
        """The texts whose segmentation holds one of ``tokens``."""
        return set().union(*(self._users.get(token, ()) for token in tokens))


def _candidates(split: dict[str, list[str]], counts: Counter, config: PhraseVocabConfig) -> list[str]:
    """Whole pieces (always), runs of 2..max_pieces pieces and substrings of pieces seen ``min_count`` times; most frequent first."""
    seen: Counter = Counter()
    whole: set[str] = set()
    for docid, parts in split.items():
        count = counts[docid]
        whole.update(parts)
        for start in range(len(parts)):
            text = parts[start]
            for end in range(start + 1, min(len(parts), start + config.max_pieces)):
                text += parts[end]
                seen[text] += count
        for part in parts:
            for start in range(len(part)):
                for end in range(start + 2, len(part) + (start > 0)):  # proper substrings; the whole piece is above
                    seen[part[start:end]] += count
    frequent = [t for t, c in seen.most_common() if c >= config.min_count]
    return list(dict.fromkeys([*frequent, *sorted(whole)]))


class HFDocidTokenizer:
    """A trained ``tokenizers.Tokenizer`` (BPE or Unigram) with this module's special ids."""

    pad_id, end_id, unk_id = PAD_ID, END_ID, UNK_ID

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts))]


def train_baseline(kind: str, docids: Sequence[str], size: int) -> HFDocidTokenizer:
    """The ``tokenizers`` library's ``"bpe"`` or ``"unigram"`` trained on ``docids`` to ``size`` tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    elif kind == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=size, special_tokens=list(SPECIAL_TOKENS), unk_token="[UNK]",
                                          show_progress=False)
    else:
        raise ValueError(f"kind={kind!r}; choose 'bpe' or 'unigram'")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.train_from_iterator(list(docids), trainer)
    return HFDocidTokenizer(tokenizer)
