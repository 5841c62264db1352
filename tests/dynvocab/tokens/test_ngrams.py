import random
import time
from collections import Counter

import pytest

from dynvocab.tokens.ngrams import SuccessorIndex, mine_ngram_counts, mine_ngrams

CORPUS = [
    [1, 2, 3, 4, 1, 2, 3],
    [9, 1, 2, 3, 5],
    [1, 2, 7, 3, 4],
]


def brute_force(sequences, min_n, max_n, min_count):
    counts = Counter(
        tuple(seq[i : i + n]) for seq in sequences for n in range(min_n, max_n + 1) for i in range(len(seq) - n + 1)
    )
    return {gram: c for gram, c in counts.items() if c >= min_count}


def test_mine_counts_on_hand_built_corpus():
    counts = dict(mine_ngram_counts(CORPUS, min_n=2, max_n=4, min_count=2))
    assert counts == {(1, 2): 4, (2, 3): 3, (1, 2, 3): 3, (3, 4): 2}
    ranked = mine_ngrams(CORPUS, min_n=2, max_n=4, min_count=2)
    assert ranked == [(1, 2), (1, 2, 3), (2, 3), (3, 4)]  # by count, then longer first
    assert mine_ngrams(CORPUS, min_n=2, max_n=4, min_count=2, top_k=2) == [(1, 2), (1, 2, 3)]
    assert mine_ngrams(CORPUS, min_n=3, max_n=3, min_count=1)[0] == (1, 2, 3)


def test_ngrams_never_cross_sequence_ends():
    assert mine_ngrams([[1, 2], [1, 2], [3, 1], [2, 3]], min_n=2, max_n=3, min_count=2) == [(1, 2)]


@pytest.mark.parametrize("seed", range(4))
def test_pruned_counting_matches_brute_force(seed):
    rng = random.Random(seed)
    sequences = [[rng.randrange(6) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    expected = brute_force(sequences, 2, 6, 3)
    assert dict(mine_ngram_counts(sequences, min_n=2, max_n=6, min_count=3)) == expected


def test_mine_rejects_bad_arguments():
    with pytest.raises(ValueError, match="min_n"):
        mine_ngrams(CORPUS, min_n=3, max_n=2)
    with pytest.raises(ValueError, match="min_count"):
        mine_ngrams(CORPUS, min_count=0)
    with pytest.raises(ValueError, match="negative"):
        mine_ngrams([[1, -5]])
    assert mine_ngrams([]) == []


def test_word_boundary_option(tokenizer):
    texts = [" The Kebra Nagast of the United States is old.", " In the Kebra Nagast of the United States, today."] * 3
    sequences = [tokenizer(t)["input_ids"] for t in texts]
    assert len(tokenizer(" Kebra")["input_ids"]) >= 2  # a word split into several tokens
    every = mine_ngrams(sequences, min_count=6)
    whole = mine_ngrams(sequences, min_count=6, tokenizer=tokenizer)
    assert set(whole) < set(every)
    decoded = {tokenizer.decode(g) for g in whole}
    assert " Kebra Nagast of the United States" in decoded
    for phrase in decoded:
        # starts at a word start; the text goes on with a space or punctuation after it
        assert phrase[0] == " " or not phrase[0].isalnum()
        for text in texts:
            at = text.find(phrase)
            assert at >= 0
            follow = text[at + len(phrase) : at + len(phrase) + 1]
            assert follow in ("", " ", ".", ",") or not phrase[-1].isalnum()
    assert " Keb" not in decoded and " Kebra Nag" not in decoded


def test_successor_index_on_hand_built_corpus():
    index = SuccessorIndex(CORPUS)
    assert len(index) == sum(map(len, CORPUS))
    assert index.occurrences((1, 2, 3)).tolist() == [0, 4, 9]
    assert index.occurrences((1, 2, 3), max_occurrences=1).tolist() == [0]
    assert index.occurrences((3,)).tolist() == [2, 6, 11, 17]
    assert index.occurrences((4, 1, 2, 9)).tolist() == []
    assert index.occurrences((99, 1)).tolist() == []
    assert index.successors((1, 2), n=2) == [(1, 2, 3), (1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 7), (1, 2, 7, 3)]
    # the sequence end stops an extension
    assert index.successors((4, 1, 2, 3), n=3) == []
    assert index.successors((2, 3), n=1, max_occurrences=1) == [(2, 3, 4)]
    with pytest.raises(ValueError, match="n="):
        index.successors((1, 2), n=0)


def test_successor_index_scales_to_a_million_tokens():
    rng = random.Random(0)
    sequences = [[rng.randrange(50_000) for _ in range(500)] for _ in range(2_000)]
    phrase = tuple(sequences[123][10:14])
    start = time.perf_counter()
    index = SuccessorIndex(sequences)
    found = index.successors(phrase, n=3, max_occurrences=8)
    assert found[0] == phrase + (sequences[123][14],)
    for _ in range(200):
        index.successors(tuple(sequences[rng.randrange(2000)][5:8]), n=3, max_occurrences=8)
    assert time.perf_counter() - start < 20
