"""Phrase calibration counts on hand-built logits."""

from types import SimpleNamespace

import pytest
import torch

from evals.calibration import (
    CalibrationCounts, calibration_counts, context_allowed, count_positions, fitting_phrases, next_item_logits,
)

V = 10
PHRASES = [(4, 5), (6, 7, 8), (4, 9)]  # ids V, V + 1, V + 2


class FixedLogits(torch.nn.Module):
    """A stand-in model: the logits of position ``t`` are row ``t`` of ``table``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table, self.vocab_size, self.device = table, V, torch.device("cpu")
        self.phrase_table = SimpleNamespace(token_ids=PHRASES)

    def forward(self, input_ids):
        assert input_ids.shape[1] == self.table.shape[0]
        return SimpleNamespace(logits=self.table[None])


def testfitting_phrases_are_found_at_every_start():
    fits = fitting_phrases(PHRASES, [4, 5, 6, 7, 8, 4, 9])
    assert fits.nonzero().tolist() == [[0, 0], [2, 1], [5, 2]]


def test_counts_per_bias_on_a_hand_built_case():
    prompt, continuation = [1, 2], [4, 5, 3, 6, 7, 8]  # phrases fit at positions 0 (V) and 3 (V + 1)
    table = torch.full((8, V + 3), -10.0)
    # logits at index prompt_len - 1 + t predict continuation[t]
    rows = {0: (4, 1.0, V, 2.0),      # phrase V fits and wins by 1
            1: (5, 3.0, V + 2, 2.5),  # the right token wins by 0.5
            2: (7, 1.0, V + 1, 0.5),  # wrong token; a phrase that does not fit is 0.5 behind
            3: (6, 2.0, V + 1, 1.0),  # the right token; the fitting phrase is 1 behind
            4: (7, 4.0, V, 0.0),
            5: (8, 4.0, V, 0.0)}
    for t, (token, token_score, phrase, phrase_score) in rows.items():
        table[1 + t, token], table[1 + t, phrase] = token_score, phrase_score
    counts = calibration_counts(FixedLogits(table), prompt, continuation, biases=[-2.0, 0.0, 0.75, 1.5])
    assert (counts.positions, counts.fits) == (6, 2)
    assert counts.wins == [0, 1, 3, 4]
    assert counts.fitting_wins == [0, 1, 1, 2]
    # bias -2: right tokens at 0, 1, 3, 4, 5; bias 0: the fitting phrase at 0 instead; bias 0.75: wrong phrases
    # win at 1 and 2; bias 1.5: the fitting phrase also wins at 3 over the right token
    assert counts.correct == [5, 5, 4, 4]
    table_rows = counts.table()
    assert table_rows[1] == pytest.approx({"bias": 0.0, "win_rate": 1 / 6, "fit_rate": 2 / 6, "precision": 1.0,
                                           "recall": 0.5, "accuracy": 5 / 6})
    assert table_rows[0]["precision"] == 0.0  # no wins: no division by zero
    # agreement with the LM's top token: only phrases that start with it compete (V at 0, V + 1 at 3)
    agreeing = calibration_counts(FixedLogits(table), prompt, continuation, biases=[1.5], agreement_top_k=1)
    assert agreeing.wins == [2] and agreeing.fitting_wins == [2] and agreeing.correct == [5]


def test_counts_add_up_only_over_the_same_biases():
    a, b = CalibrationCounts([0.0, 1.0]), CalibrationCounts([0.0, 1.0])
    a.positions, a.wins, b.positions, b.wins = 3, [1, 2], 4, [0, 3]
    a.add(b)
    assert a.positions == 7 and a.wins == [1, 5]
    with pytest.raises(ValueError, match="cannot be added"):
        a.add(CalibrationCounts([0.0]))


def test_the_context_gate_is_scored_where_the_text_ends_with_a_phrase_context():
    prompt, continuation = [1, 2], [4, 5, 3, 6, 7, 8]
    # phrase V follows (1, 2), phrase V + 1 follows (5, 3), phrase V + 2 follows (9, 9), which never occurs
    contexts = {(1, 2): [(4, 5)], (5, 3): [(6, 7, 8)], (9, 9): [(4, 9)], (2, 4): [(1, 1)]}  # (1, 1): not a phrase
    allowed = context_allowed(contexts, PHRASES, prompt, continuation)
    assert allowed.nonzero().tolist() == [[0, 0], [3, 1]]
    assert not context_allowed({}, PHRASES, prompt, continuation).any()
    # every phrase scores 5 above every token: ungated, a phrase wins everywhere; gated, only where it may
    table = torch.zeros(8, V + 3)
    table[:, V:] = 5.0
    logits = next_item_logits(FixedLogits(table), prompt, continuation)
    free = count_positions(logits, V, PHRASES, continuation, [0.0])
    gated = count_positions(logits, V, PHRASES, continuation, [0.0], allowed=allowed)
    assert free.wins == [6] and gated.wins == [2] and gated.fitting_wins == [2]
