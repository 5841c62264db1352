"""Forward maximum matching over token ids."""

from dynvocab.tokens.segmentation import forward_max_match

PHRASES = {(1, 2): 0, (1, 2, 3): 1, (4, 5): 2}


def test_spans_cover_every_token_and_take_the_longest_phrase_first():
    spans = forward_max_match([9, 1, 2, 3, 7, 4, 5, 1], PHRASES.get, max_phrase_tokens=8)
    assert spans == [(0, 1, None), (1, 4, 1), (4, 5, None), (5, 7, 2), (7, 8, None)]


def test_with_word_boundaries_a_phrase_must_start_and_end_on_one():
    # one word of three pieces "1 2 8": the phrase (1, 2) would end inside it
    assert forward_max_match([1, 2, 8], PHRASES.get, 8, [True, False, False, True]) == [
        (0, 1, None), (1, 2, None), (2, 3, None)
    ]
    # words "1 2" | "8" | "4 5" | "6": the phrase (1, 2) is the whole first word, (4, 5) the whole third
    boundaries = [True, False, True, True, False, True, True]
    assert forward_max_match([1, 2, 8, 4, 5, 6], PHRASES.get, 8, boundaries) == [
        (0, 2, 0), (2, 3, None), (3, 5, 2), (5, 6, None)
    ]
