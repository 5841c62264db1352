"""The exact phrase scorer: one dot product per phrase, masked phrases at -inf."""

import torch

from dynvocab.scoring.dot_product import DotProductScorer


def test_scores_are_dot_products_in_the_hidden_states_dtype_with_masked_phrases_at_minus_inf():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, -1.0]]])  # (B=1, T=2, d=2), float32
    vectors = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]], dtype=torch.bfloat16)  # a bf16 table
    scores = DotProductScorer()(hidden, vectors, torch.tensor([[True, False, True]]))
    assert scores.dtype == torch.float32
    inf = float("inf")
    assert scores.tolist() == [[[1.0, -inf, 6.0], [3.0, -inf, 4.0]]]


def test_a_one_position_slice_of_a_longer_sequence_scores_as_a_fresh_tensor():
    # the last position of a (1, T, d) sequence has a large stride on its size-1 batch dimension
    sequence = torch.randn(1, 7, 16)
    vectors = torch.randn(40, 16).to(torch.bfloat16)
    last = sequence[:, -1:]
    assert last.stride()[0] == 7 * 16
    fresh = torch.empty(1, 1, 16).copy_(last)
    torch.testing.assert_close(DotProductScorer()(last, vectors), DotProductScorer()(fresh, vectors))
    assert DotProductScorer()(sequence, vectors).shape == (1, 7, 40)
