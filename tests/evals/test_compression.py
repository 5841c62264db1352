import math

import pytest

from evals import compression, compression_from_segments


def test_bytes_and_steps_by_hand():
    # "héllo" is 6 UTF-8 bytes (é takes two)
    result = compression(["ab", "héllo"], [1, 2])
    assert (result.total_bytes, result.total_steps, result.num_sequences) == (8, 3, 2)
    assert result.bytes_per_step == pytest.approx(8 / 3)
    assert result.steps_per_sequence == pytest.approx(1.5)
    assert math.isnan(result.tokens_per_step) and result.base_tokens == -1


def test_segments_with_phrases_against_a_character_tokenizer():
    # step 1 emits the phrase "the cat" (7 chars), step 2 " sat" (4 chars), then "!" (1 char)
    result = compression_from_segments([["the cat", " sat"], ["!"]], base_tokenizer=list)
    assert result.total_steps == 3
    assert result.base_tokens == 12
    assert result.tokens_per_step == pytest.approx(4.0)
    assert result.bytes_per_step == pytest.approx(4.0)


def test_hf_tokenizer_counts_without_special_tokens(word_tokenizer):
    result = compression_from_segments([["the cat sat", " on a mat"]], base_tokenizer=word_tokenizer)
    assert result.base_tokens == 6
    assert result.tokens_per_step == pytest.approx(3.0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="one step count per text"):
        compression(["a"], [1, 2])
    with pytest.raises(ValueError, match="no decoding steps"):
        compression(["", ""], [0, 0])
    with pytest.raises(ValueError, match="non-negative integers"):
        compression(["a"], [-1])
    with pytest.raises(TypeError, match="lists of str"):
        compression_from_segments(["the cat"])
