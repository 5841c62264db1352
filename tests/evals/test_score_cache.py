import json

import pytest

from evals.score_cache import ScoreCache, score_key


def test_figures_are_computed_once_per_input_and_survive_a_restart(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"mauve": 90.0 + len(calls)}

    key = score_key("quality", {"model": "m"}, [["prompt", "text"]])
    assert ScoreCache(tmp_path).get_or_compute(key, compute) == {"mauve": 91.0}
    reopened = ScoreCache(tmp_path)
    assert reopened.get_or_compute(key, compute) == {"mauve": 91.0} and reopened.hits == 1 and len(calls) == 1
    for other in (score_key("quality", {"model": "m"}, [["prompt", "other text"]]),
                  score_key("quality", {"model": "other"}, [["prompt", "text"]]),
                  score_key("bounds", {"model": "m"}, [["prompt", "text"]])):
        assert other != key and reopened.get_or_compute(other, compute)["mauve"] > 91.0
    assert len(calls) == 4


def test_a_cut_last_line_is_dropped_and_a_foreign_line_is_refused(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text(json.dumps({"key": "a", "figures": {"mauve": 1.0}}) + "\n" + '{"key": "b", "fig')
    assert ScoreCache(tmp_path).entries == {"a": {"mauve": 1.0}}
    assert path.read_text().endswith("}\n")
    path.write_text(json.dumps({"mauve": 1.0}) + "\n")
    with pytest.raises(ValueError, match="delete the file to rescore"):
        ScoreCache(tmp_path)
