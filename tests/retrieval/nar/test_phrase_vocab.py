"""The phrase vocabulary: single-class pieces, fewest-token encodings, pruning to size, saving; BPE/Unigram baselines."""

import itertools
import math
import random
from collections import Counter

import pytest

from retrieval.nar.vocab import (
    SPECIAL_TOKENS, PhraseVocabConfig, PhraseVocabulary, _candidates, pieces, train_baseline,
)

DOCIDS = ["New York City", "New York Times", "New Zealand", "York Minster", "Apollo 11", "Apollo 13 (film)",
          "History of New York City", "History of Rome", "Rome", "Times Square"] * 3


def test_pieces_keep_one_character_class_and_join_back():
    assert pieces("Apollo 13 (film)") == ["Apollo", " 13", " (", "film", ")"]
    assert pieces("R2-D2's  x") == ["R", "2", "-", "D", "2", "'", "s", "  x"]
    for text in DOCIDS:
        assert "".join(pieces(text)) == text


def brute_fewest(vocab: PhraseVocabulary, text: str) -> int:
    """Fewest tokens by trying every token at every position (single characters, substrings of one piece,
    runs of whole pieces), top-down."""
    parts = pieces(text)
    starts = [sum(map(len, parts[:i])) for i in range(len(parts) + 1)]

    def options(i: int) -> list[int]:
        piece = max(k for k in range(len(parts)) if starts[k] <= i)
        ends = [i + 1] + [j for j in range(i + 2, starts[piece + 1] + 1) if text[i:j] in vocab.ids]
        if i in starts:
            ends += [starts[k] for k in range(piece + 2, len(parts) + 1) if text[i : starts[k]] in vocab.ids]
        return ends

    def fewest(i: int) -> int:
        return 0 if i == len(text) else min(1 + fewest(j) for j in options(i))

    return fewest(0)


def test_encodings_are_fewest_tokens_and_decode_back():
    vocab = PhraseVocabulary.train(DOCIDS, PhraseVocabConfig(size=60, min_count=2), show_progress_bar=False)
    assert vocab.vocab_size <= 60 and tuple(vocab.tokens[:3]) == SPECIAL_TOKENS
    for text in sorted(set(DOCIDS) | {"New Rome", "Zealand Times 11", "Romeo"}):
        ids = vocab.encode(text)
        assert vocab.decode(ids) == text
        assert len(ids) == brute_fewest(vocab, text)


def test_pruning_keeps_the_phrases_that_save_most():
    vocab = PhraseVocabulary.train(DOCIDS, PhraseVocabConfig(size=45, min_count=2), show_progress_bar=False)
    phrases = [t for t in vocab.tokens[3:] if len(t) > 1]
    assert "New York City" in vocab.ids  # frequent and long: it saves the most characters
    assert len(vocab.encode("History of New York City")) < len(pieces("History of New York City"))
    assert len(vocab.tokens) == 45 and len(phrases) == 45 - 3 - len({c for d in DOCIDS for c in d})


def test_unseen_characters_are_unknown():
    vocab = PhraseVocabulary.train(DOCIDS, PhraseVocabConfig(size=50), show_progress_bar=False)
    assert vocab.encode("Rome ☃")[-1] == vocab.unk_id


def test_save_and_load_round_trip(tmp_path):
    vocab = PhraseVocabulary.train(DOCIDS, PhraseVocabConfig(size=50), show_progress_bar=False)
    vocab.save(tmp_path / "vocab")
    again = PhraseVocabulary.load(tmp_path / "vocab")
    assert again.tokens == vocab.tokens and again.config == vocab.config
    (tmp_path / "vocab" / "vocab.json").write_text("[]")
    with pytest.raises(ValueError, match="vocab.json is corrupted"):
        PhraseVocabulary.load(tmp_path / "vocab")


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_baselines_share_the_special_ids_and_stay_within_size(kind):
    tokenizer = train_baseline(kind, DOCIDS, 60)
    assert tokenizer.vocab_size <= 60
    assert [tokenizer.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert all(ids for ids in tokenizer.encode_batch(["New York City", "Rome"]))


def pruned_from_scratch(docids: list[str], config: PhraseVocabConfig) -> list[str]:
    """The pruning's definition: every round segments every docid and spells every phrase anew."""
    counts = Counter(docids)
    split = {d: pieces(d) for d in counts}
    characters = sorted({c for d in counts for c in d})
    base = [*SPECIAL_TOKENS, *characters]
    phrases = [c for c in _candidates(split, counts, config) if c not in set(characters)]
    target, rounds = config.size - len(base), 0
    while len(phrases) > target:
        vocab = PhraseVocabulary(base + phrases, config)
        uses = Counter(t for d, parts in split.items() for t in vocab._segment(parts) for _ in range(counts[d]))

        def saved(phrase: str) -> int:
            del vocab.ids[phrase]
            spelled = len(vocab._segment(pieces(phrase)))
            vocab.ids[phrase] = 0
            return spelled - 1

        earn = {p: uses[p] * saved(p) if uses[p] else 0 for p in phrases}
        excess = len(phrases) - target
        drop = min(excess, max(1000, math.ceil(config.prune_fraction * excess)))
        dropped = set(sorted(phrases, key=lambda p: (earn[p], uses[p], p))[:drop])
        phrases = [p for p in phrases if p not in dropped]
        rounds += 1
    assert rounds >= 3  # the incremental updates were exercised
    return base + phrases


def test_pruning_that_segments_again_only_what_a_dropped_token_touched_equals_pruning_from_scratch():
    rng = random.Random(0)
    words = ["river", "rivers", "red", "blue", "lake", "old", "castle", "new", "newton", "york", "13", "1969", "(film)",
             "saint", "st.", "john", "johnson", "battle", "of", "the", "war", "1812", "king", "kingdom"]
    docids = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 5))) for _ in range(1500)]
    config = PhraseVocabConfig(size=300, min_count=1, max_pieces=5)
    assert PhraseVocabulary.train(docids, config, show_progress_bar=False).tokens == pruned_from_scratch(docids, config)
