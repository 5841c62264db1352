"""Score ``eval-qa`` answers and write results.json and report.md (command, settings, versions, targets met or missed)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

from retrieval.qa.citations import strip_markers
from retrieval.qa.answering import shown_document

from .citations import alce_citation_scores, answer_support, evidence_citations, exact_provenance, hf_entailment
from .protocol import QAEvalConfig, parse_qa_system
from .metrics import qa_scores
from ..report import environment
from ..repetition import loops

#: the issue's targets, checked on every system with phrases
TARGETS = {"answer_support_precision": 0.60, "correct_citation": 0.30, "exact_provenance_phrase": 1.0}
TIME_TARGET_S = 45 * 60

NLI_SKIPPED = ("skipped: no NLI model was given (--nli-model NAME_OR_PATH) and none is available offline on this "
               "machine; ALCE's citation recall and precision need one, so these columns are left out rather than faked")


def entailment_judge(config: QAEvalConfig):
    """``(entails, note)``: the NLI judge of ``--nli-model``, or None and why the ALCE columns are skipped."""
    if not config.nli_model:
        return None, NLI_SKIPPED
    try:
        return hf_entailment(config.nli_model), f"NLI model: {config.nli_model}"
    except (ValueError, OSError) as error:
        return None, f"skipped: {error}"


def score_system(records: list[dict], items: dict, pages: dict, config: QAEvalConfig, entails) -> dict:
    """Every metric of one system over its answers (in question order)."""
    sums = {"str_em": 0.0, "em": 0.0, "f1": 0.0, "rouge_l": 0.0}
    supported = cited = correct = answered_with_citation = answerable = 0
    on_evidence = evidence_cited = 0
    provenance = {"phrase": [0, 0], "model": [0, 0], "copy": [0, 0]}
    alce = {"citation_recall": 0.0, "citation_precision": 0.0}
    for record in records:
        item = items[record["id"]]
        documents = [shown_document(pages[i], config.document_words) for i in record["documents"]]
        plain = strip_markers(record["answer"])
        for key, value in qa_scores(plain, item["answer_groups"], item["references"]).items():
            sums[key] += value
        golds = [a for group in item["answer_groups"] for a in group]
        support = answer_support(record["cited"], documents, golds)
        answerable += answer_support(range(1, len(documents) + 1), documents, golds)["correct"]
        supported, cited = supported + support["supported_citations"], cited + support["citations"]
        correct += support["correct"]
        if item.get("evidence") is not None:
            counts = evidence_citations(record["cited"], record["documents"], item["evidence"])
            on_evidence, evidence_cited = on_evidence + counts["evidence_citations"], evidence_cited + counts["citations"]
        answered_with_citation += bool(record["cited"])
        for origin, counts in provenance.items():
            mine = [c for c in record["citations"] if c["origin"] == origin]
            if mine:
                counts[0] += exact_provenance(mine, documents)["exact_provenance"] * len(mine)
                counts[1] += len(mine)
        if entails is not None:
            for key, value in alce_citation_scores(record["answer"], documents, entails).items():
                if key in alce:
                    alce[key] += value
    n = len(records)
    result = {key: value / n for key, value in sums.items()} | {
        "questions": n,
        "gold_in_documents": answerable / n,
        "answer_support_precision": supported / cited if cited else float("nan"),
        "correct_citation": correct / n,
        "evidence_page_precision": on_evidence / evidence_cited if evidence_cited else float("nan"),
        "answers_with_citation": answered_with_citation / n,
        "looping_answers": sum(loops(strip_markers(r["answer"])) for r in records),
        "citations_per_answer": sum(len(r["citations"]) for r in records) / n,
        **{f"{origin}_citations": counts[1] for origin, counts in provenance.items()},
        **{f"exact_provenance_{origin}": counts[0] / counts[1] if counts[1] else float("nan")
           for origin, counts in provenance.items()},
        "phrase_share": sum(r["phrase_steps"] for r in records) / max(1, sum(r["steps"] for r in records)),
        "phrases_per_question": sum(r["phrases"] for r in records) / n,
        "steps_per_answer": sum(r["steps"] for r in records) / n,
        "seconds_per_answer": sum(r["seconds"] for r in records) / n,
    }
    if entails is not None:
        result |= {key: value / n for key, value in alce.items()}
    return result


def score_all(records: list[dict], item_list: list[dict], pages: dict, config: QAEvalConfig) -> tuple[dict, str]:
    entails, nli_note = entailment_judge(config)
    items = {item["id"]: item for item in item_list}
    order = {item["id"]: i for i, item in enumerate(item_list)}
    results = {}
    for name in config.system_names:
        mine = sorted((r for r in records if r["system"] == name and r["id"] in items), key=lambda r: order[r["id"]])
        if mine:
            results[name] = score_system(mine, items, pages, config, entails)
    return results, nli_note


def targets(results: dict, wall_seconds: float) -> list[tuple[str, str, bool | None, str]]:
    """``(system, target, met, figure)`` rows: the issue's targets for every system with phrases, and the run's time.

    Against the bare LM on the same documents: STR-EM and F1 not below it, correct citation
    above it, and no looping answer.
    """
    rows = []
    for name, m in results.items():
        system = parse_qa_system(name)
        if system.phrases == "none":
            continue
        for key, goal in TARGETS.items():
            value = m[key]
            met = None if math.isnan(value) else value >= goal - 1e-12
            gap = "" if met or met is None else f", {100 * (goal - value):.1f} points short"
            rows.append((name, f"{key.replace('_', ' ')} >= {100 * goal:.0f}%", met, f"{_pct(value)}{gap}"))
        bare = f"bare@{system.k}" + ("+oracle" if system.oracle else "")
        if bare in results:
            for key in ("str_em", "f1"):
                value, floor = m[key], results[bare][key]
                met = value >= floor - 1e-12
                gap = "" if met else f", {100 * (floor - value):.1f} points below"
                rows.append((name, f"{key.upper().replace('_', '-')} not below {bare}", met, f"{_pct(value)} vs {_pct(floor)}{gap}"))
            value, floor = m["correct_citation"], results[bare]["correct_citation"]
            rows.append((name, f"correct citation above {bare}", value > floor + 1e-12,
                         f"{_pct(value)} vs {_pct(floor)} ({_questions(value - floor, m['questions'])})"))
        looping = m["looping_answers"]
        rows.append((name, "no answer with a loop", looping == 0,
                     f"{looping} of {m['questions']} answers" + (f" (bare: {results[bare]['looping_answers']})" if bare in results else "")))
    minutes = wall_seconds / 60
    met = wall_seconds <= TIME_TARGET_S
    rows.append(("whole run", "within 45 minutes", met,
                 f"{minutes:.1f} min" + ("" if met else f", {minutes - TIME_TARGET_S / 60:.1f} min over")))
    return rows


#: the columns compared against the bare counterpart (the same documents, no phrases)
COMPARED = ("str_em", "em", "f1", "rouge_l", "answer_support_precision", "correct_citation", "evidence_page_precision")


def losses(results: dict) -> list[str]:
    """One line per phrase system naming each column where it is below ``bare`` on the same documents, and by how much."""
    lines = []
    for name, m in results.items():
        system = parse_qa_system(name)
        bare = f"bare@{system.k}" + ("+oracle" if system.oracle else "")
        if system.phrases == "none" or bare not in results:
            continue
        below = [f"{key} {_pct(m[key])} vs {_pct(results[bare][key])}" for key in COMPARED
                 if not math.isnan(m[key]) and not math.isnan(results[bare][key]) and m[key] < results[bare][key] - 1e-12]
        if below:
            lines.append(f"- {name} (against {bare}): " + "; ".join(below))
    return lines


def _threads(summary: dict) -> str:
    """`` on 2 torch threads``, and how many answers predate the count being recorded."""
    threads, unknown = summary["generation_threads"], summary["answers_without_threads"]
    text = f" on {' or '.join(map(str, threads))} torch threads" if threads else ""
    return text + (f" ({unknown} answers made before the thread count was recorded)" if unknown else "")


def _questions(share: float, questions: int) -> str:
    """A difference of shares as questions: ``+1 question``, ``-3 questions``."""
    count = round(share * questions)
    return f"{count:+d} question" + ("" if abs(count) == 1 else "s")


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def write_report(config: QAEvalConfig, command: str, records: list[dict], items: list[dict], evidence: dict,
                 pages: dict) -> Path:
    """results.json and report.md in ``config.output_dir``; returns the report's path."""
    out = Path(config.output_dir)
    results, nli_note = score_all(records, items, pages, config)
    wall = sum(r.get("question_seconds", 0.0) for r in records)
    threads = sorted({r["threads"] for r in records if "threads" in r})
    rows = targets(results, wall)
    summary = {"command": command, "config": asdict(config), "environment": environment(), "evidence_in_top_k": evidence,
               "generation_seconds": wall, "generation_threads": threads,
               "answers_without_threads": sum("threads" not in r for r in records), "nli": nli_note, "systems": results,
               "targets": [{"system": s, "target": t, "met": m, "figure": f} for s, t, m, f in rows]}
    _replace(out / "results.json", json.dumps(summary, indent=2, default=str) + "\n")
    _replace(out / "report.md", _markdown(summary, results, rows, config))
    return out / "report.md"


def _replace(path: Path, text: str) -> None:
    """Write ``text`` beside ``path``, then rename it over: a complete file is at ``path`` at every instant."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _markdown(summary: dict, results: dict, rows: list, config: QAEvalConfig) -> str:
    env = summary["environment"]
    lines = [
        "# Citation-aware QA", "",
        f"Command: `{summary['command']}`", "",
        f"Data: {config.data} ({next(iter(results.values()))['questions'] if results else 0} questions); model {config.model}, "
        f"phrase encoder {config.checkpoint or 'shipped (dynvocab/checkpoints/smollm2-wikipedia)'}; greedy, at most "
        f"{config.max_new_tokens} steps, documents cut to {config.document_words} words, at most {config.max_phrases} "
        f"phrases per document, agreement top-{config.agreement_top_k}, each phrase at most {config.phrase_max_uses}x.", "",
        f"Versions: python {env['python']}, torch {env['torch']}, transformers {env['transformers']}; report written on {env['machine']}.", "",
        "Evidence page among the retrieved documents: " + ", ".join(
            f"k={k}: {_pct(rate)}" for k, rate in summary["evidence_in_top_k"].items()) + "", "",
        f"Generation time (all sessions of this run): {summary['generation_seconds'] / 60:.1f} min{_threads(summary)}.", "",
        "## Answers", "",
        "| system | gold in docs | STR-EM | EM | F1 | ROUGE-L | answers citing | cit./answer | answer-support prec. | "
        "correct citation | evidence-page prec. | exact prov. (phrase / model / copy) | phrase steps | loops | s/answer |",
        "|" + "---|" * 15,
    ]
    for name, m in results.items():
        lines.append(
            f"| {name} | {_pct(m['gold_in_documents'])} | {_pct(m['str_em'])} | {_pct(m['em'])} | {_pct(m['f1'])} | {_pct(m['rouge_l'])} | "
            f"{_pct(m['answers_with_citation'])} | {m['citations_per_answer']:.2f} | {_pct(m['answer_support_precision'])} | "
            f"{_pct(m['correct_citation'])} | {_pct(m['evidence_page_precision'])} | {_pct(m['exact_provenance_phrase'])} ({m['phrase_citations']}) / "
            f"{_pct(m['exact_provenance_model'])} ({m['model_citations']}) / "
            f"{_pct(m.get('exact_provenance_copy', float('nan')))} ({m.get('copy_citations', 0)}) | {_pct(m['phrase_share'])} | "
            f"{m['looping_answers']} | {m['seconds_per_answer']:.2f} |"
        )
    lines += ["", "## ALCE citation recall and precision", ""]
    if any("citation_recall" in m for m in results.values()):
        lines += ["| system | citation recall | citation precision |", "|---|---|---|"]
        lines += [f"| {n} | {_pct(m['citation_recall'])} | {_pct(m['citation_precision'])} |" for n, m in results.items()]
        lines.append("")
    lines += [summary["nli"], "", "## Where the phrase systems lose to the same LM without phrases", ""]
    lines += losses(results) or ["Nowhere: every phrase system is at least level with its bare counterpart on every column."]
    lines += ["", "## Targets", "", "| system | target | met | figure |", "|---|---|---|---|"]
    lines += [f"| {s} | {t} | {'n/a' if m is None else 'yes' if m else 'NO'} | {f} |" for s, t, m, f in rows]
    lines += ["", "Definitions: STR-EM is ASQA's (a gold answer found in the normalised answer, markers removed); EM and F1 "
              "are SQuAD's over the whole answer; ROUGE-L is rouge-score's ROUGE-Lsum F1 against the gold answers joined; "
              "gold in docs is the share of questions with a gold answer in one of the documents shown (the ceiling of "
              "correct citation; FanOutQA's answers come from another Wikipedia snapshot than the leads, so figures such as "
              "populations often differ); answer-support precision is the share of cited documents (each once per answer) that contain a gold answer; "
              "correct citation is the share of answers citing at least one such document; evidence-page precision is "
              "the share of cited documents that are the page FanOutQA names as holding the answer (no answer string "
              "needed; a measure beside the targets, not one of them); loops counts answers in which a word 4-gram (lowercased, punctuation dropped) "
              "occurs three times or more (markers removed); exact provenance is the share "
              "of citations whose span is verbatim in the document cited (phrase: placed from an emitted phrase; model: "
              "written by the model, its span the text since the previous marker or sentence start; copy: placed by "
              "grounded answering after a span copied verbatim).", ""]
    return "\n".join(lines)
