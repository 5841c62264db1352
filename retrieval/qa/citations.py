"""Citations by construction: document-numbered phrases, the numbered prompt, and ``[n]`` markers placed from provenance.

A phrase cut from document ``n`` of a question's documents carries ``source=str(n)``. With
markers on, its text also ends with ``[n]`` (the paper's "phrase[2]"): the phrase table holds
``" the Seine[1]"`` as one entry, the model emits it in one step, reads the marker back like
any text it wrote, and the citation is exact. With markers off the phrase text is plain and
``[n]`` is written after it when the answer is put together. A marker the model writes in
its own tokens is kept and counted as a model-written citation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dynvocab import Phrase, Segment

__all__ = [
    "MARKER",
    "SENTENCE_END",
    "Citation",
    "cite_copies",
    "cite_segments",
    "document_block",
    "marker",
    "numbered_phrases",
    "strip_markers",
]

#: a citation marker as the answers write it: ``[3]``
MARKER = re.compile(r"\[(\d+)\]")

#: the end of a sentence of an answer: . ! or ? (with closing quotes or brackets, and any markers right after it)
#: before whitespace or the end; not after a lone letter ("J. Smith")
SENTENCE_END = re.compile(r"(?<!\b\w)[.!?][\"')\]]*((?:\s*\[\d+\])*)(?=\s|$)")


def marker(number: int) -> str:
    return f"[{number}]"


def strip_markers(text: str) -> str:
    """``text`` without its ``[n]`` markers (and the space a marker leaves before punctuation)."""
    return re.sub(r"\s+([.,;:!?])", r"\1", MARKER.sub("", text)).strip()


def document_block(number: int, document: Mapping[str, str]) -> str:
    """One document as the prompt shows it (ALCE's format): ``Document [n](Title: t): text``."""
    title = document.get("title") or document.get("id") or ""
    return f"Document {marker(number)}(Title: {title}): {document['text']}"


def numbered_phrases(phrases_by_document: Sequence[Sequence[Phrase]], markers: bool) -> list[Phrase]:
    """Phrases of each document (in document order, 1-based numbers), ``source`` set to the number.

    With ``markers`` each text ends with its document's ``[n]``. Without, a text found in several
    documents keeps the first (best-ranked) one, as the phrase table would.
    """
    out, seen = [], set()
    for number, phrases in enumerate(phrases_by_document, start=1):
        for phrase in phrases:
            text = phrase.text + marker(number) if markers else phrase.text
            if text not in seen:
                seen.add(text)
                out.append(Phrase(text, str(number)))
    return out


@dataclass(frozen=True)
class Citation:
    """One ``[n]`` in an answer: the document it cites, the span it stands after, and where it came from.

    ``origin`` is ``"phrase"`` (placed from the provenance of an emitted phrase: ``span`` is the
    phrase text, cut verbatim from document ``number``), ``"copy"`` (placed after a span the answer copied verbatim
    from document ``number``, see ``cite_copies``) or ``"model"`` (written by the model in its own tokens: ``span``
    is the text between the previous marker or sentence start and it).
    ``start`` is the marker's character offset in the answer.
    """

    number: int
    span: str
    origin: str
    start: int


def cite_segments(segments: Sequence[Segment], num_documents: int) -> tuple[str, list[Citation]]:
    """The answer with inline ``[n]`` markers, and every citation in it, in order.

    A phrase segment with a numeric ``source`` is followed by its marker (already part of its
    text when markers are on; written here when they are off). Markers anywhere else are the
    model's own; one naming no document (``[0]``, or past ``num_documents``) is dropped from the
    answer, as is a model marker repeating the one just placed.
    """
    parts: list[str] = []
    citations: list[Citation] = []
    length = 0

    def emit(text: str) -> None:
        nonlocal length
        parts.append(text)
        length += len(text)

    for segment in segments:
        number = _document_number(segment.source) if segment.is_phrase else None
        if number is None:
            _emit_model_text(segment.text, emit, lambda: "".join(parts), citations, num_documents)
            continue
        body = segment.text[: -len(marker(number))] if segment.text.endswith(marker(number)) else segment.text
        emit(body)
        citations.append(Citation(number, body.strip(), "phrase", length))
        emit(marker(number))
    return "".join(parts), citations


def _document_number(source: str | None) -> int | None:
    return int(source) if source is not None and source.isdigit() else None


def _emit_model_text(text: str, emit, written, citations: list[Citation], num_documents: int) -> None:
    """Emit a run of the model's tokens, recording (or dropping) the markers it wrote."""
    position = 0
    for match in MARKER.finditer(text):
        emit(text[position : match.start()])
        position = match.end()
        number = int(match.group(1))
        so_far = written()
        if not 1 <= number <= num_documents:
            continue
        if citations and citations[-1].start + len(marker(citations[-1].number)) == len(so_far) \
                and citations[-1].number == number:
            continue  # "[2][2]": the model repeated the marker its phrase carried
        citations.append(Citation(number, _span_before(so_far), "model", len(so_far)))
        emit(marker(number))
    emit(text[position:])


def _span_before(text: str) -> str:
    """The text a model-written marker at the end of ``text`` stands after: back to the previous marker or sentence end."""
    cut = max((m.end() for m in MARKER.finditer(text)), default=0)
    tail = text[cut:]
    ends = [m.end() for m in re.finditer(r"[.!?]\s+", tail) if m.end() < len(tail)]
    return tail[ends[-1] if ends else 0 :].strip()


def cite_copies(answer: str, citations: Sequence[Citation], documents: Sequence[Mapping], tokenizer,
                min_tokens: int = 4) -> tuple[str, list[Citation]]:
    """The answer with ``[n]`` written after every span of at least ``min_tokens`` tokens that stands verbatim in
    document ``n`` (``dynvocab.decoding.citations.cite``: grounded decoding's citations by construction), unless that marker
    follows the span already; ``citations`` (of ``cite_segments``) moved along, and the new ones (origin ``"copy"``)
    among them in order."""
    from dynvocab.decoding.citations import cite

    plain = [(m.start(), m.end()) for m in MARKER.finditer(answer)]
    # tokenized as it was written, after a space: its first word is then the token the document has mid-text
    spans = cite(tokenizer(" " + answer, add_special_tokens=False)["input_ids"], [d["text"] for d in documents],
                 tokenizer, min_tokens)
    inserted: list[tuple[int, int, str]] = []  # (where, number, span) in the answer as it was
    for span in spans:
        begin = answer.find(span.text, max(0, span.start - 3))  # offsets in " " + answer: the answer's, give or take
        end = begin + len(span.text)
        if begin < 0 or any(start < end and begin < stop for start, stop in plain):
            continue  # not found, or through a marker
        if end < len(answer) and answer[end].isalnum() and answer[end - 1].isalnum():  # ends inside a word ("17|th")
            end = max((i for i in range(begin, end) if not answer[i].isalnum()), default=begin)
            end = len(answer[:end].rstrip())
            if end <= begin:
                continue
        number = span.document + 1
        if marker(number) not in re.match(r"[\s.,;:!?]*(?:\[\d+\])*", answer[end:]).group():
            inserted.append((end, number, answer[begin:end]))
    parts, moved, last, shift = [], [], 0, 0
    for where, number, text in inserted:
        parts += [answer[last:where], marker(number)]
        moved.append(Citation(number, text, "copy", where + shift))
        shift += len(marker(number))
        last = where
    parts.append(answer[last:])
    for citation in citations:
        before = sum(len(marker(number)) for where, number, _ in inserted if where <= citation.start)
        moved.append(Citation(citation.number, citation.span, citation.origin, citation.start + before))
    return "".join(parts), sorted(moved, key=lambda c: c.start)
