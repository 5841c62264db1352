"""The evals package's bad-input catalogue: metrics and evaluation settings name what is wrong with their input."""

import numpy as np
import pytest

from evals import diversity, mauve_score, rep_n, summarize, time_callable
from evals.protocol import EvalConfig
from evals.systems import parse_system

CASES = [
    ("rep_n a bare string", lambda: rep_n("the cat", 2), TypeError, "wrap it in a list"),
    ("rep_n n = 0", lambda: rep_n(["the cat"], 0), ValueError, "positive integer"),
    ("diversity a bare string", lambda: diversity("abc"), TypeError, "wrap it in a list"),
    ("diversity ints", lambda: diversity([1, 2]), TypeError, "texts (str) or token lists"),
    ("mauve features of two dimensions", lambda: mauve_score(np.zeros((10, 4)), np.zeros((10, 5))), ValueError,
     "one featurizer"),
    ("mauve NaN features", lambda: mauve_score(np.full((10, 4), np.nan), np.zeros((10, 4))), ValueError, "nan or inf"),
    ("mauve one sample", lambda: mauve_score(np.zeros((1, 4)), np.zeros((1, 4))), ValueError, "n >= 2"),
    ("mauve texts instead of features", lambda: mauve_score("a", "b"), TypeError, "featurize the texts first"),
    ("summarize no samples", lambda: summarize([]), ValueError, "at least one run"),
    ("summarize a negative time", lambda: summarize([-1.0, 2.0]), ValueError, "monotonic"),
    ("time_callable zero repeats", lambda: time_callable(lambda: 1, repeats=0), ValueError, "repeats must be >= 1"),
    ("time_callable a non-callable", lambda: time_callable(5), TypeError, "callable"),
    ("EvalConfig zero prompts", lambda: EvalConfig(num_prompts=0), ValueError, "num_prompts=0"),
    ("EvalConfig prompts as a string", lambda: EvalConfig(num_prompts="200"), TypeError, "must be int"),
    ("EvalConfig an unknown corpus", lambda: EvalConfig(data="news"), ValueError, "choose one of wikipedia, licenses, licensedb, licensedb-families"),
    ("EvalConfig an unknown decoding", lambda: EvalConfig(decoding="beam"), ValueError, "'greedy' or 'nucleus'"),
    ("EvalConfig top_p of 0", lambda: EvalConfig(top_p=0.0), ValueError, "top_p"),
    ("EvalConfig an unknown featurizer", lambda: EvalConfig(mauve_featurizer="bert"), ValueError, "mauve_featurizer"),
    ("EvalConfig negative latency prompts", lambda: EvalConfig(latency_prompts=-1), ValueError, ">= 0"),
    ("a system with no name", lambda: parse_system(""), ValueError, "unknown base"),
    ("a system with an unknown setting", lambda: parse_system("dynamic:colour=red"), ValueError, "key=value"),
    ("a system setting that is not a number", lambda: parse_system("dynamic:bias=abc"), ValueError, "not a float"),
    ("a system capped at 0 phrases", lambda: parse_system("dynamic@0"), ValueError, "must be positive"),
]


@pytest.mark.parametrize(("call", "error", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_a_clear_error(call, error, fragment):
    with pytest.raises(error) as raised:
        call()
    assert fragment in str(raised.value)
