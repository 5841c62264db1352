"""Citation quality: ALCE's citation recall and precision (with a pluggable NLI model), and the checks that need none.

* ``alce_citation_scores`` follows ALCE (Gao et al., 2023, ``eval.py``): an answer is split into
  statements (sentences); a statement is supported when the concatenation of the documents it
  cites entails it (recall = supported statements / all statements, an uncited statement
  counts as unsupported); a citation of a supported statement with several citations is
  irrelevant when it alone does not entail the statement and the others still do (precision =
  relevant citations / all citations). ``entails(premise, hypothesis) -> bool`` is any NLI
  judge: ``hf_entailment(name_or_path)`` wraps a Hugging Face NLI classifier.
* ``exact_provenance``: is each cited span verbatim in the document it cites.
* ``answer_support``: does a cited document contain a gold answer (normalised, as STR-EM tests it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from retrieval.qa.citations import MARKER, SENTENCE_END, strip_markers

from .metrics import normalize_answer

__all__ = [
    "Statement",
    "alce_citation_scores",
    "answer_support",
    "evidence_citations",
    "exact_provenance",
    "format_document",
    "hf_entailment",
    "split_statements",
]

Entails = Callable[[str, str], bool]



@dataclass(frozen=True)
class Statement:
    """A sentence of an answer: its text without markers and the documents it cites (1-based, in order)."""

    text: str
    cited: tuple[int, ...]


def split_statements(answer: str) -> list[Statement]:
    """The answer's sentences with the ``[n]`` markers inside each (markers right after its period belong to it)."""
    statements, start = [], 0
    for match in SENTENCE_END.finditer(answer):
        statements.append(answer[start : match.end()])
        start = match.end()
    statements.append(answer[start:])
    out = []
    for sentence in statements:
        text = strip_markers(sentence)
        if text:
            cited = tuple(dict.fromkeys(int(n) for n in MARKER.findall(sentence)))
            out.append(Statement(text, cited))
    return out


def format_document(document: Mapping[str, str]) -> str:
    """A document as ALCE gives it to the NLI model: ``Title: t`` then its text."""
    return f"Title: {document.get('title', '')}\n{document['text']}"


def alce_citation_scores(answer: str, documents: Sequence[Mapping[str, str]], entails: Entails,
                         at_most_citations: int = 3) -> dict[str, float]:
    """ALCE's citation recall and precision of one answer, in [0, 1]; ``documents`` are numbered 1.. in order.

    A statement citing a number with no document is unsupported; at most ``at_most_citations``
    citations per statement are judged (ALCE's default of 3).
    """
    statements = split_statements(answer)
    if not statements:
        return {"citation_recall": 0.0, "citation_precision": 0.0, "statements": 0, "citations": 0}
    supported = relevant = total = 0
    for statement in statements:
        cited = list(statement.cited[:at_most_citations])
        if not cited or any(not 1 <= n <= len(documents) for n in cited):
            continue
        total += len(cited)
        joint = entails(_passages(documents, cited), statement.text)
        supported += joint
        if not joint:
            continue
        if len(cited) == 1:
            relevant += 1
            continue
        for n in cited:
            if entails(_passages(documents, [n]), statement.text):
                relevant += 1
            elif not entails(_passages(documents, [m for m in cited if m != n]), statement.text):
                relevant += 1  # needed: without it the rest no longer entails the statement
    return {"citation_recall": supported / len(statements), "citation_precision": relevant / total if total else 0.0,
            "statements": len(statements), "citations": total}


def _passages(documents: Sequence[Mapping[str, str]], numbers: Sequence[int]) -> str:
    return "\n".join(format_document(documents[n - 1]) for n in numbers)


def hf_entailment(name_or_path: str, device: str | None = None, max_length: int = 512) -> Entails:
    """``entails(premise, hypothesis)`` from a Hugging Face NLI classifier (any name or local path).

    The model's ``id2label`` must name an entailment class; the pair entails when that class
    has the highest score. The model is held by the returned function only (no global cache).
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForSequenceClassification.from_pretrained(name_or_path).eval()
    except OSError as error:
        raise ValueError(f"NLI model {name_or_path!r} cannot be loaded ({error}); pass a local folder or a Hub name "
                         "of a sequence-classification NLI model (e.g. an MNLI-trained one)") from error
    labels = {i: str(label).lower() for i, label in model.config.id2label.items()}
    entail = [i for i, label in labels.items() if label.startswith("entail")]
    if len(entail) != 1:
        raise ValueError(f"NLI model {name_or_path!r} has labels {sorted(labels.values())}, none (or several) of them "
                         "'entailment'; pass an NLI classifier whose config names its entailment class")
    if device:
        model.to(device)

    @torch.no_grad()
    def entails(premise: str, hypothesis: str) -> bool:
        inputs = tokenizer(premise, hypothesis, truncation="only_first", max_length=max_length, return_tensors="pt")
        logits = model(**inputs.to(model.device)).logits[0]
        return int(logits.argmax()) == entail[0]

    return entails


def exact_provenance(citations: Sequence[Mapping], documents: Sequence[Mapping[str, str]]) -> dict[str, float | int]:
    """Share of citations whose span occurs verbatim in the document they cite.

    ``citations`` are ``{"number", "span"}`` (``retrieval.qa.citations.Citation`` as a dict); an empty
    span or a number with no document counts as not verbatim. Returns the share and the count.
    """
    if not citations:
        return {"exact_provenance": float("nan"), "citations": 0}
    hits = sum(
        bool(c["span"]) and 1 <= c["number"] <= len(documents) and c["span"] in documents[c["number"] - 1]["text"]
        for c in citations
    )
    return {"exact_provenance": hits / len(citations), "citations": len(citations)}


def answer_support(cited: Sequence[int], documents: Sequence[Mapping[str, str]],
                   answers: Sequence[str]) -> dict[str, float | int]:
    """Does each cited document contain a gold answer (normalised substring, as STR-EM tests answers)?

    Returns ``supported_citations`` (cited documents containing one), ``citations`` (cited
    documents, each counted once), and ``correct`` (1.0 when at least one does, else 0.0).
    """
    if isinstance(answers, str) or not answers:
        raise ValueError(f"answers={answers!r} must be a non-empty list of gold answer strings")
    golds = [normalize_answer(a) for a in answers if normalize_answer(a)]
    numbers = [n for n in dict.fromkeys(cited) if 1 <= n <= len(documents)]
    supported = sum(any(g in normalize_answer(documents[n - 1]["text"]) for g in golds) for n in numbers)
    return {"supported_citations": supported, "citations": len(numbers), "correct": float(supported > 0)}


def evidence_citations(cited: Sequence[int], document_ids: Sequence[str], evidence: str) -> dict[str, int]:
    """How many cited documents (each once) are the question's evidence page: ``evidence_citations`` and ``citations``.

    A support measure that needs no answer string: FanOutQA names the page that holds each answer,
    while its answers come from another snapshot than the documents and often miss by a figure.
    """
    numbers = [n for n in dict.fromkeys(cited) if 1 <= n <= len(document_ids)]
    return {"evidence_citations": sum(document_ids[n - 1] == evidence for n in numbers), "citations": len(numbers)}
