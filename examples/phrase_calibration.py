"""How often a phrase wins against how often the reference text holds one, for a sweep of biases.

Teacher-forced over held-out Wikipedia leads (the evaluation's prompts and references),
each with the phrases the pipeline plugs in for it; one forward pass per prompt scores
every bias (``evals.calibration``). Writes ``results.json`` and ``report.md``.

    python examples/phrase_calibration.py --num-prompts 200 --output-dir runs/calibration

On a domain whose held-out documents are too few to hold some out for choosing settings, ``--split indexed``
reads indexed documents instead, each retrieving from the index without itself (leave one out):

    python examples/phrase_calibration.py --data licenses --split indexed --num-prompts 100 \
        --context-tokens 0,3,4 --output-dir results/calibration/licenses/dev

``--state-thresholds 0.95,0.97`` scores the state gate (``dynvocab.states.keys``) at those cosines too: the keys of
each prompt's documents cost one LM pass over them.

Choosing the bias on other held-out leads than those reported (``--skip 200`` passes over
the evaluation's 200) and writing it into a copy of the checkpoint:

    python examples/phrase_calibration.py --skip 200 --num-prompts 100 --checkpoint RUN/final \
        --write-bias CALIBRATED --output-dir runs/calibration-dev
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dynvocab.config import CONFIG_NAME
from dynvocab.data.corpora import corpus_split
from dynvocab.io.atomic import MANIFEST, atomic_directory
from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
from dynvocab.states.keys import state_keys
from dynvocab.states.store import DocumentStates
from evals.calibration import CalibrationCounts, context_allowed, count_positions, next_item_logits
from evals.protocol import EvalConfig, document_prompts
from retrieval.config import PipelineConfig
from retrieval.document_states import document_token_ids
from retrieval.loading import demo_index
from retrieval.phrases import document_contexts
from retrieval.pipeline import PhrasePipeline

BIASES = (-4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0)


def write_calibrated(checkpoint: Path, target: Path, model, bias: float) -> None:
    """A copy of ``checkpoint`` whose config adds ``bias`` to the phrase scores, saved (and signed) atomically."""
    model.dynvocab_config.phrase_score_bias += bias
    with atomic_directory(target) as staging:
        for entry in checkpoint.iterdir():
            if entry.name in (CONFIG_NAME, MANIFEST):
                continue
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, staging / entry.name)
        model.dynvocab_config.save(staging)


def gate_label(gate: tuple[str, float]) -> str:
    """``", context 4"``, ``", state 0.97"``, or ``""`` for no gate."""
    kind, value = gate
    return f", {kind} {value:g}" if value or kind == "state" else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--skip", type=int, default=0, help="held-out prompts passed over first (200: not the reported ones)")
    parser.add_argument("--write-bias", help="write a copy of --checkpoint with the most accurate bias (as the pipeline "
                                             "decodes) added to its phrase scores into this folder")
    parser.add_argument("--checkpoint", default=str(SHIPPED_ENCODER))
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--data", default="wikipedia", choices=("wikipedia", "licenses"),
                        help="embedded corpus of the held-out prompts and of the index the phrases come from")
    parser.add_argument("--output-dir", default="runs/calibration")
    parser.add_argument("--split", default="held-out", choices=("held-out", "indexed"),
                        help="read held-out documents, or indexed ones that each retrieve without themselves")
    parser.add_argument("--context-tokens", default="0",
                        help="comma-separated left-context sizes of the context gate to score (0: no gate)")
    parser.add_argument("--state-thresholds", default="",
                        help="comma-separated cosines of the state gate to score (dynvocab.states.keys; default none)")
    args = parser.parse_args()
    thresholds = sorted({float(t) for t in args.state_thresholds.split(",") if t.strip()})
    # a gate is ("context", n) (n = 0: none) or ("state", cosine)
    gates = [("context", n) for n in sorted({int(n) for n in args.context_tokens.split(",")})]
    gates += [("state", t) for t in thresholds]

    start = time.perf_counter()
    model = load_dynamic_lm(args.model, args.checkpoint)
    config = EvalConfig(model=args.model, data=args.data, num_prompts=args.skip + args.num_prompts,
                        output_dir=args.output_dir)
    indexed, held_out = corpus_split(config.data)
    prompts = document_prompts(model.tokenizer, held_out if args.split == "held-out" else indexed, config)[args.skip :]
    pipeline = PhrasePipeline(model, demo_index(Path(".cache/demo"), config.data), PipelineConfig())
    # the raw scores, the strictest rule (the first token is the LM's own top token), and as the pipeline decodes
    agreements = sorted({0, 1, pipeline.config.decoding_settings()["agreement_top_k"]})
    totals = {(k, gate): CalibrationCounts(BIASES) for k in agreements for gate in gates}
    tokens_right = 0  # positions where the LM's own top token is right (phrases off)
    states = DocumentStates(model.lm)  # each retrieved document read by the LM once
    for item in tqdm(prompts, desc="calibration"):
        found = pipeline.index.search_documents([item["prompt"]], k=pipeline.config.top_k + 1)[0]
        documents = [d for d in found if d.get("id") != item["id"]][: pipeline.config.top_k]  # leave itself out
        model.set_phrases(pipeline.candidates(documents), mid_sentence_forms=False)
        table = model.phrase_table.token_ids
        prompt_ids = model.tokenizer(item["prompt"]).input_ids
        reference_ids = model.tokenizer(item["reference"], add_special_tokens=False).input_ids
        seen = []  # the states the phrases are scored on, for the state gate
        hook = model.lm.get_output_embeddings().register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0]))
        logits = next_item_logits(model, prompt_ids, reference_ids)  # one forward pass for every setting
        hook.remove()
        tokens_right += int((logits[:, : model.vocab_size].argmax(-1) == torch.tensor(reference_ids)).sum())
        keys = state_keys(states, document_token_ids(model.tokenizer, documents), table,
                          threshold=0.0) if thresholds and documents else None
        for gate in gates:
            kind, value = gate
            if kind == "context":
                allowed = (context_allowed(document_contexts(documents, model.tokenizer, table, value), table,
                                           prompt_ids, reference_ids) if value else None)
            elif keys is None:
                allowed = torch.zeros(len(reference_ids), len(table), dtype=torch.bool)
            else:
                hidden = seen[-1][:, len(prompt_ids) - 1 : -1]
                allowed = dataclasses.replace(keys, threshold=value).open(hidden, len(table))[0].cpu()
            for k in agreements:
                totals[k, gate].add(count_positions(logits, model.vocab_size, table, reference_ids, BIASES, k, allowed))
    tables = {key: total.table() for key, total in totals.items()}
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(sys.argv)
    settings = {"checkpoint": args.checkpoint, "model": args.model, "data": args.data, "split": args.split,
                "prompts": len(prompts), "skipped": args.skip,
                "positions": totals[agreements[0], gates[0]].positions,
                "pipeline": pipeline.config.__dict__ | pipeline.config.decoding_settings(),
                "configured_bias": model.dynvocab_config.phrase_score_bias,
                "torch": torch.__version__, "python": platform.python_version(), "seconds": time.perf_counter() - start}
    off = tokens_right / settings["positions"]
    rule, chosen = max(((key, r) for key, rows in tables.items() for r in rows), key=lambda item: item[1]["accuracy"])
    results = {"command": command, "settings": settings,
               "agreement_top_k": {str(k): rows for (k, gate), rows in tables.items() if gate == gates[0]},
               "context_gate": {f"agreement {k}, context {n}": rows for (k, (kind, n)), rows in tables.items()
                                if kind == "context"},
               "state_gate": {f"agreement {k}, state {t:g}": rows for (k, (kind, t)), rows in tables.items()
                              if kind == "state"},
               "most_accurate": {"agreement_top_k": rule[0],
                                 "context_tokens": rule[1][1] if rule[1][0] == "context" else 0,
                                 "state_threshold": rule[1][1] if rule[1][0] == "state" else None, **chosen,
                                 "accuracy_phrases_off": off}}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Phrase calibration: how often a phrase wins against how often the reference holds one",
        "",
        f"Command: `{command}` ({settings['seconds'] / 60:.1f} min, {torch.get_num_threads()} threads)",
        "",
        f"{len(prompts)} {args.split} {config.data} {'leads' if config.data == 'wikipedia' else 'documents'} "
        f"(after the first {args.skip}), {settings['positions']} reference positions read by teacher forcing, "
        f"checkpoint `{args.checkpoint}`, the pipeline's default phrases per prompt. Bias is added to every phrase "
        "logit on top of the checkpoint's own. *fit*: some plugged-in phrase spells the next reference tokens; "
        "*accuracy*: the top item is right (a fitting phrase, or the next reference token). *context n*: only "
        "phrases that follow the text's last n tokens in a retrieved document compete (`dynvocab.decoding.context_gate`). "
        "*state c*: only phrases whose state before them in a retrieved document is within cosine c of the LM's "
        "state compete (`dynvocab.states.keys`).",
        "",
    ]
    for (k, gate), rows in tables.items():
        best = max(rows, key=lambda row: row["accuracy"])
        lines += [
            f"## {'Raw scores (no agreement)' if k == 0 else f'With first-token agreement, top {k}'}"
            f"{' (as the pipeline decodes)' if k == pipeline.config.decoding_settings()['agreement_top_k'] else ''}"
            f"{gate_label(gate)}",
            "",
            "| bias | phrase wins | phrase fits | precision | recall | accuracy |",
            "|---|---|---|---|---|---|",
            *(f"| {r['bias']:+.1f} | {100 * r['win_rate']:.1f}% | {100 * r['fit_rate']:.1f}% | {100 * r['precision']:.1f}% "
              f"| {100 * r['recall']:.1f}% | {100 * r['accuracy']:.1f}% |" for r in rows),
            "",
            f"Highest accuracy at bias {best['bias']:+.1f}: {100 * best['accuracy']:.1f}% "
            f"(bias 0: {100 * next(r for r in rows if r['bias'] == 0)['accuracy']:.1f}%).",
            "",
        ]
    lines += ["## The most accurate rule on these documents", ""]
    if chosen["accuracy"] <= off:
        lines += [f"No rule beats phrases off ({100 * off:.2f}%): here phrases should not replace the LM's tokens.", ""]
    else:
        lines += [
            f"Agreement {'off' if not rule[0] else f'top {rule[0]}'}, {gate_label(rule[1])[2:] or 'no gate'}, "
            f"bias {chosen['bias']:+.1f}: accuracy {100 * chosen['accuracy']:.2f}% against {100 * off:.2f}% with phrases off "
            f"({100 * chosen['win_rate']:.1f}% phrase wins, {100 * chosen['precision']:.1f}% precision, "
            f"{100 * chosen['recall']:.1f}% recall). Decode with it: `--agreement_top_k {rule[0]} "
            f"{'--state_threshold' if rule[1][0] == 'state' else '--context_tokens'} {rule[1][1]:g} "
            f"--phrase_bias {chosen['bias']:g}`.",
            "",
        ]
    if args.write_bias:
        decoded = tables[max(agreements), gates[0]]  # with the agreement rule the pipeline decodes with
        best = max(decoded, key=lambda row: row["accuracy"])["bias"]
        write_calibrated(Path(args.checkpoint), Path(args.write_bias), model, best)
        lines += [f"Wrote {args.write_bias}: the checkpoint with phrase_score_bias "
                  f"{model.dynvocab_config.phrase_score_bias:+.1f} (the most accurate bias above added).", ""]
    (out / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
