"""Answer quality as SQuAD and ASQA define it: normalisation, exact match, token F1, STR-EM, ROUGE-L.

Each function takes a prediction and its gold answers (strings) and returns a float in [0, 1].
``answer_groups`` follows ASQA: one group per disambiguated sub-question, each a list of
acceptable short answers; a plain list of answers is one group per answer (every one must
be found), which is how FanOutQA's list answers read.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = ["exact_match", "normalize_answer", "qa_scores", "rouge_l", "str_em", "token_f1"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles (a, an, the), single spaces."""
    if not isinstance(text, str):
        raise TypeError(f"an answer must be a str, got {type(text).__name__} {text!r}")
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _answers(answers: Sequence[str] | str, name: str = "answers") -> list[str]:
    if isinstance(answers, str):
        raise TypeError(f"{name} must be a list of gold answers, not the single string {answers!r}; wrap it in a list")
    answers = list(answers)
    if not answers:
        raise ValueError(f"{name} is empty: a question needs at least one gold answer")
    return answers


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer (SQuAD EM), else 0.0."""
    return float(any(normalize_answer(prediction) == normalize_answer(gold) for gold in _answers(answers)))


def token_f1(prediction: str, answers: Sequence[str]) -> float:
    """SQuAD's token F1 of the normalised prediction against its best gold answer."""

    def f1(gold: str) -> float:
        predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
        if not predicted or not wanted:
            return float(predicted == wanted)
        common = sum((Counter(predicted) & Counter(wanted)).values())
        if not common:
            return 0.0
        precision, recall = common / len(predicted), common / len(wanted)
        return 2 * precision * recall / (precision + recall)

    return max(f1(gold) for gold in _answers(answers))


def str_em(prediction: str, answer_groups: Sequence[Sequence[str] | str]) -> float:
    """ASQA's STR-EM: the share of answer groups with a short answer found (normalised) in the prediction.

    A group given as a plain string is one acceptable answer.
    """
    groups = [[g] if isinstance(g, str) else _answers(g, "an answer group") for g in _answers(answer_groups, "answer_groups")]
    text = normalize_answer(prediction)
    return sum(any(_contains(text, normalize_answer(a)) for a in group) for group in groups) / len(groups)


def _contains(text: str, answer: str) -> bool:
    """ALCE's ``exact_presence``: a plain substring test of normalised strings (so "4" is found in "1945")."""
    return bool(answer) and answer in text


def rouge_l(prediction: str, references: Sequence[str]) -> float:
    """ROUGE-Lsum F-measure (Porter stemming) against the best reference, by Google's ``rouge-score`` as ALCE uses it.

    Needs ``pip install dynvocab[evals]`` (``rouge-score``).
    """
    try:
        from rouge_score import rouge_scorer, tokenizers
    except ImportError as error:
        raise ImportError("ROUGE-L needs the rouge-score package: pip install 'dynvocab[evals]'") from error
    # its default tokenizer, passed explicitly (left out, rouge-score logs a line per scorer it builds)
    scorer = rouge_scorer.RougeScorer(["rougeLsum"], tokenizer=tokenizers.DefaultTokenizer(use_stemmer=True))
    return max(scorer.score(reference, prediction)["rougeLsum"].fmeasure for reference in _answers(references, "references"))


def qa_scores(prediction: str, answer_groups: Sequence[Sequence[str] | str], references: Sequence[str] | None = None) -> dict[str, float]:
    """STR-EM over the groups; EM and F1 against every short answer; ROUGE-L against ``references``
    (long answers; default: the short answers joined by ", ")."""
    groups = [[g] if isinstance(g, str) else list(g) for g in _answers(answer_groups, "answer_groups")]
    flat = [a for group in groups for a in group]
    references = references or [", ".join(group[0] for group in groups)]
    return {"str_em": str_em(prediction, groups), "em": exact_match(prediction, flat), "f1": token_f1(prediction, flat),
            "rouge_l": rouge_l(prediction, references)}
