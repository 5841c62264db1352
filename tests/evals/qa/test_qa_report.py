"""The QA report's loop count and its targets against the bare LM on the same documents."""

import pytest

from evals.qa.report import targets
from evals.repetition import loops


def test_loops_counts_a_word_ngram_three_times():
    assert loops("is a planet's surface is a planet's surface is a planet's surface")
    assert not loops("is a planet's surface is a planet's surface")  # twice is not a loop
    assert not loops("Canberra is the capital of Australia; Canberra is in the ACT.")
    assert loops("the highest mountain on Earth, the second-highest mountain on earth and the highest mountain on Earth.")
    assert loops(["a", "b"] * 3, n=2) and not loops(["a", "b"] * 3, n=2, times=4)
    with pytest.raises(ValueError, match="times >= 2"):
        loops("a a a", times=1)


def _metrics(correct_citation: float, looping: int, str_em: float = 0.1) -> dict:
    return {"questions": 150, "str_em": str_em, "f1": 0.03, "correct_citation": correct_citation,
            "looping_answers": looping, "answer_support_precision": 0.2, "exact_provenance_phrase": 1.0}


def test_targets_ask_for_more_correct_citations_than_bare_and_no_loops():
    results = {"bare@3": _metrics(0.20, 2), "ngram@3": _metrics(0.22, 0), "content@3": _metrics(0.20, 1),
               "ngram-nomark@3": _metrics(0.20 + 1 / 150, 0)}
    rows = {(system, target): (met, figure) for system, target, met, figure in targets(results, 60.0)}
    assert rows[("ngram@3", "correct citation above bare@3")] == (True, "22.0% vs 20.0% (+3 questions)")
    assert rows[("content@3", "correct citation above bare@3")][0] is False  # level is not above
    assert rows[("ngram-nomark@3", "correct citation above bare@3")] == (True, "20.7% vs 20.0% (+1 question)")
    assert rows[("ngram@3", "no answer with a loop")] == (True, "0 of 150 answers (bare: 2)")
    assert rows[("content@3", "no answer with a loop")][0] is False
    assert not any(system == "bare@3" for system, _ in rows)  # the bare LM is the reference, not a system under test
