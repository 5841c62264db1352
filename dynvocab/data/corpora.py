"""The embedded corpora (offline Wikipedia leads, licence texts, ScanCode LicenseDB) and their fixed train/held-out
splits.

Training, the retrieval index and the evaluation all take the same split, so the
held-out documents that ``dynvocab eval`` prompts with are never trained on or retrieved.

LicenseDB is split by licence family (a key's first part: ``bsd`` of ``bsd-new``), two ways:

- ``licensedb`` (variants): a third of the licences of each family with three or more usable ones (not deprecated, at
  least 150 words) are held out; the others of the family stay indexed, so a held-out licence has near-twins there;
- ``licensedb-families`` (new families): whole families are held out, in a seeded order, until 240 licences are; no
  member of a held-out family is indexed.

The indexed part is every other licence, and the rules (notices, references, snippets) whose licence expression names
no held-out licence (variants) or no licence of a held-out family (new families).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from functools import lru_cache

from .assets import fanoutqa_dev, license_texts, licensedb_documents, wikipedia_leads

__all__ = ["CORPORA", "LICENSEDB_SPLITS", "WIKIPEDIA_HELD_OUT", "corpus_split", "fanoutqa_subquestions", "licence_family",
           "split_documents", "split_licensedb"]

logger = logging.getLogger(__name__)


def split_documents(documents: list[dict], held_out: float = 0.05, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Split documents into (train, held-out), deterministically.

    Documents are shuffled with ``random.Random(seed)``; the first ``round(held_out * n)``
    (at least one) are held out. Both lists keep the input order, so the split is the
    same on every machine.
    """
    if not 0.0 < held_out < 1.0:
        raise ValueError(f"held_out={held_out} must be a fraction in (0, 1); pass e.g. 0.05")
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)
    chosen = set(order[: max(1, round(held_out * len(documents)))])
    train = [doc for i, doc in enumerate(documents) if i not in chosen]
    heldout = [doc for i, doc in enumerate(documents) if i in chosen]
    logger.info("split: %d train and %d held-out documents", len(train), len(heldout))
    return train, heldout


#: share of the offline Wikipedia leads held out from training and from the retrieval index: a fifth leaves
#: 246 held-out leads of at least 32 + 128 SmolLM2 tokens, enough for the 200-prompt evaluation protocol
WIKIPEDIA_HELD_OUT = 0.2


#: LicenseDB prompts: licences that are not deprecated and have at least this many words
LICENSEDB_MIN_WORDS = 150
#: the held-out licences of ``licensedb-families``: whole families until at least this many
LICENSEDB_FAMILY_HELD_OUT = 240
LICENSEDB_SPLITS = ("variants", "families")


def licence_family(key: str) -> str:
    """A LicenseDB licence's family: its key's first part (``bsd-new`` -> ``bsd``, ``gpl-2.0-plus`` -> ``gpl``)."""
    return re.split(r"[-_.]", key, maxsplit=1)[0]


def split_licensedb(documents: list[dict], how: str, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(indexed, held-out) LicenseDB documents (``read_licensedb``'s), split by ``how``: ``"variants"`` or
    ``"families"`` (module docstring). Deterministic; both lists keep the input order."""
    if how not in LICENSEDB_SPLITS:
        raise ValueError(f"how={how!r}; choose one of {LICENSEDB_SPLITS}")
    licences = [d for d in documents if d["kind"] == "license"]
    usable = [d for d in licences if not d["metadata"].get("is_deprecated") and len(d["text"].split()) >= LICENSEDB_MIN_WORDS]
    families: dict[str, list[str]] = {}
    for document in usable:
        families.setdefault(licence_family(document["id"]), []).append(document["id"])
    rng = random.Random(seed)
    if how == "variants":
        held: set[str] = set()
        for name in sorted(families):
            members = sorted(families[name])
            if len(members) >= 3:
                rng.shuffle(members)
                held.update(members[: len(members) // 3])
        named = held  # a rule that names a held-out licence would hand its text to the index
    else:
        order = sorted(families)
        rng.shuffle(order)
        held_families: set[str] = set()
        count = 0
        for name in order:
            if count >= LICENSEDB_FAMILY_HELD_OUT:
                break
            held_families.add(name)
            count += len(families[name])
        held = {d["id"] for d in usable if licence_family(d["id"]) in held_families}
        named = {d["id"] for d in licences if licence_family(d["id"]) in held_families}  # deprecated ones too
    indexed = [d for d in documents
               if (d["kind"] == "license" and d["id"] not in named)
               or (d["kind"] == "rule" and not _expression_keys(d["metadata"].get("license_expression")) & named)]
    held_out = [d for d in usable if d["id"] in held]
    logger.info("licensedb %s split: %d indexed (%d licences) and %d held-out licences", how, len(indexed),
                sum(d["kind"] == "license" for d in indexed), len(held_out))
    return indexed, held_out


def _expression_keys(expression) -> set[str]:
    """The licence keys a rule's ``license_expression`` names (``"mit OR apache-2.0"`` -> ``{"mit", "apache-2.0"}``)."""
    words = re.findall(r"[\w.+-]+", str(expression or ""))
    return {w.lower() for w in words} - {"and", "or", "with"}


@lru_cache(maxsize=2)
def _licensedb_split(how: str) -> tuple[list[dict], list[dict]]:
    return split_licensedb(licensedb_documents(), how)


#: the embedded corpora: name -> its (indexed, held-out) split
CORPORA: dict[str, Callable[[], tuple[list[dict], list[dict]]]] = {
    "wikipedia": lambda: split_documents(wikipedia_leads(), WIKIPEDIA_HELD_OUT),
    "licenses": lambda: split_documents(license_texts(), 0.1),
    "licensedb": lambda: _licensedb_split("variants"),
    "licensedb-families": lambda: _licensedb_split("families"),
}


def corpus_split(name: str) -> tuple[list[dict], list[dict]]:
    """(indexed, held-out) documents of an embedded corpus, the same split training uses."""
    if name not in CORPORA:
        raise ValueError(f"corpus {name!r} is not embedded; choose from {sorted(CORPORA)}")
    return CORPORA[name]()


def fanoutqa_subquestions() -> list[dict]:
    """FanOutQA dev (sub-)questions whose evidence page is one of the offline Wikipedia leads.

    Returns 558 items over 312 pages, in the published order, each
    ``{"id", "question", "answers", "title"}``: ``title`` is the evidence lead's title (its
    document id) and ``answers`` the gold answer as strings (a list answer gives one
    string per item; numbers as written by ``str``; a yes/no answer as "yes"/"no"; a
    mapping as "key: value" strings).
    """
    titles = {document["title"] for document in wikipedia_leads()}
    found: list[dict] = []

    def walk(questions: list[dict]) -> None:
        for question in questions:
            evidence = question.get("evidence") or {}
            if evidence.get("title") in titles:
                found.append(
                    {
                        "id": question["id"],
                        "question": question["question"],
                        "answers": _answer_strings(question["answer"]),
                        "title": evidence["title"],
                    }
                )
            walk(question.get("decomposition") or [])

    walk(fanoutqa_dev())
    return found


def _answer_strings(answer) -> list[str]:
    if isinstance(answer, bool):
        return ["yes" if answer else "no"]
    if isinstance(answer, list):
        return [text for item in answer for text in _answer_strings(item)]
    if isinstance(answer, dict):
        return [f"{key}: {value}" for key, value in answer.items()]
    return [str(answer)]
