"""QA and citation metrics on hand-built cases whose answers are known."""

import math

import pytest

from evals.qa.citations import (
    alce_citation_scores,
    answer_support,
    evidence_citations,
    exact_provenance,
    format_document,
    split_statements,
)
from evals.qa.metrics import exact_match, normalize_answer, qa_scores, rouge_l, str_em, token_f1

DOCS = [
    {"title": "Seine", "text": "The Seine flows through Paris."},
    {"title": "Loire", "text": "The Loire is the longest river in France."},
    {"title": "Tokyo", "text": "Tokyo is the capital of Japan."},
]


# ---------------------------------------------------------------- SQuAD / ASQA
def test_normalisation_is_squads():
    assert normalize_answer("The  Seine, River!") == "seine river"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("680,000") == "680000"


def test_exact_match_and_f1():
    assert exact_match("the Seine.", ["Seine", "Loire"]) == 1.0
    assert exact_match("Seine river", ["Seine"]) == 0.0
    assert token_f1("Seine river", ["Seine"]) == pytest.approx(2 * 0.5 * 1 / 1.5)  # precision 1/2, recall 1
    assert token_f1("Loire", ["Seine", "the Loire"]) == 1.0
    assert token_f1("", ["Seine"]) == 0.0
    assert token_f1("the", ["a"]) == 1.0  # both normalise to nothing


def test_str_em_counts_answer_groups_found():
    answer = "Paris lies on the Seine, and Tours on the Loire."
    assert str_em(answer, [["Seine", "Sequana"], ["Loire"], ["Rhone"]]) == pytest.approx(2 / 3)
    assert str_em(answer, ["Seine"]) == 1.0  # a plain string is a group of one
    assert str_em("It was in 1945.", ["4"]) == 1.0  # ALCE's substring test


def test_rouge_l_is_rouge_lsum_f1():
    assert rouge_l("the cat sat on the mat", ["the cat sat on the mat"]) == pytest.approx(1.0)
    assert rouge_l("dog", ["the cat sat"]) == 0.0
    # LCS "cat sat mat" (3) of 4 and 6 tokens: P 3/4, R 3/6
    assert rouge_l("cat sat mat today", ["the cat sat on the mat"]) == pytest.approx(2 * 0.75 * 0.5 / 1.25)
    assert rouge_l("cat", ["dog", "cat"]) == pytest.approx(1.0)  # the best reference


def test_qa_scores_bundle():
    assert qa_scores("Seine.", [["Seine"]]) == pytest.approx({"str_em": 1.0, "em": 1.0, "f1": 1.0, "rouge_l": 1.0})
    scores = qa_scores("The Seine and the Loire.", [["Seine"], ["Rhone"]], references=["The Seine and the Rhone."])
    assert scores["str_em"] == 0.5 and scores["em"] == 0.0 and scores["rouge_l"] == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [(lambda: exact_match("x", "Seine"), TypeError, "single string"), (lambda: token_f1("x", []), ValueError, "empty"),
     (lambda: str_em("x", [[]]), ValueError, "empty"), (lambda: normalize_answer(3), TypeError, "str")],
)
def test_bad_gold_answers_are_refused(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()


# ---------------------------------------------------------------- statements and ALCE citations
def test_statements_keep_the_markers_inside_them():
    statements = split_statements("The Seine[1] flows through Paris. [1][2] Tokyo is in Japan[3]. No citation here")
    assert [(s.text, s.cited) for s in statements] == [
        ("The Seine flows through Paris.", (1, 2)), ("Tokyo is in Japan.", (3,)), ("No citation here", ())]
    assert split_statements("J. Smith wrote it[2].")[0].cited == (2,)


def words_entail(premise: str, hypothesis: str) -> bool:
    """A toy NLI judge: every content word of the hypothesis occurs in the premise."""
    words = {w.strip(".,").lower() for w in premise.split()}
    return all(w.strip(".,").lower() in words for w in hypothesis.split() if len(w.strip(".,")) > 3)


def test_alce_recall_and_precision_on_a_hand_built_answer():
    answer = ("The Seine flows through Paris [1][3]. "  # supported by 1 alone: [3] is irrelevant
              "Tokyo is the capital of Japan [3]. "  # supported
              "The Loire is the longest river [1]. "  # cites the wrong document: unsupported
              "Paris is big.")  # no citation: unsupported
    scores = alce_citation_scores(answer, DOCS, words_entail)
    assert scores["citation_recall"] == pytest.approx(2 / 4)
    assert scores["citation_precision"] == pytest.approx(2 / 4)  # [1] of sentence 1 and [3] of sentence 2, of 4
    assert scores["statements"] == 4 and scores["citations"] == 4


def test_alce_counts_a_citation_needed_with_another_as_relevant():
    documents = [{"title": "A", "text": "Ada was born in London."}, {"title": "B", "text": "Ada wrote programs."}]
    scores = alce_citation_scores("Ada, born in London, wrote programs [1][2].", documents, words_entail)
    assert scores["citation_recall"] == 1.0 and scores["citation_precision"] == 1.0
    assert alce_citation_scores("Ada wrote it [9].", documents, words_entail)["citation_recall"] == 0.0
    assert format_document(documents[0]) == "Title: A\nAda was born in London."


def test_the_nli_judge_sees_the_titled_documents():
    seen = []
    alce_citation_scores("Paris [1].", DOCS, lambda premise, hypothesis: seen.append((premise, hypothesis)) or True)
    assert seen == [("Title: Seine\nThe Seine flows through Paris.", "Paris.")]


def test_an_nli_model_without_an_entailment_label_is_refused(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    from evals.qa.citations import hf_entailment
    from tests.helpers import word_tokenizer

    config = BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                        num_labels=2, id2label={0: "positive", 1: "negative"}, label2id={"positive": 0, "negative": 1})
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="entailment"):
        hf_entailment(str(tmp_path))
    with pytest.raises(ValueError, match="cannot be loaded"):
        hf_entailment(str(tmp_path / "missing"))


def test_an_hf_nli_classifier_judges_pairs(tmp_path):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from evals.qa.citations import hf_entailment
    from tests.helpers import word_tokenizer

    labels = {0: "ENTAILMENT", 1: "neutral", 2: "contradiction"}
    config = BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                        num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()})
    model = BertForSequenceClassification(config)
    with torch.no_grad():  # a classifier that always says "entailment"
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([5.0, 0.0, 0.0]))
    model.save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    entails = hf_entailment(str(tmp_path))
    assert entails("the cat sat", "a cat") is True


# ---------------------------------------------------------------- offline citation checks
def test_exact_provenance_checks_spans_against_the_cited_document():
    citations = [{"number": 1, "span": "flows through Paris"}, {"number": 2, "span": "flows through Paris"},
                 {"number": 3, "span": "capital of Japan"}, {"number": 4, "span": "capital"}, {"number": 3, "span": ""}]
    assert exact_provenance(citations, DOCS) == {"exact_provenance": pytest.approx(2 / 5), "citations": 5}
    assert math.isnan(exact_provenance([], DOCS)["exact_provenance"])


def test_answer_support_looks_for_the_gold_answer_in_cited_documents():
    assert answer_support([1, 2, 1], DOCS, ["the seine"]) == {"supported_citations": 1, "citations": 2, "correct": 1.0}
    assert answer_support([2, 3], DOCS, ["Seine"]) == {"supported_citations": 0, "citations": 2, "correct": 0.0}
    assert answer_support([], DOCS, ["Seine"]) == {"supported_citations": 0, "citations": 0, "correct": 0.0}
    assert answer_support([9], DOCS, ["Seine"])["citations"] == 0  # no such document
    with pytest.raises(ValueError, match="non-empty list"):
        answer_support([1], DOCS, "Seine")


def test_evidence_citations_count_cited_documents_that_are_the_evidence_page():
    ids = ["Paris", "Seine", "Tokyo"]
    assert evidence_citations([2, 1, 2], ids, "Seine") == {"evidence_citations": 1, "citations": 2}
    assert evidence_citations([1, 3], ids, "Seine") == {"evidence_citations": 0, "citations": 2}
    assert evidence_citations([4, 0], ids, "Seine") == {"evidence_citations": 0, "citations": 0}  # no such documents
