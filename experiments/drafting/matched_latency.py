"""Drafting against the system it must match: equal texts, steps and time per prompt, from one evaluation run.

A drafting system (``dynamic:verify=1:...:draft=N``) writes the LM's own text, so it is compared with the bare LM
under the same safeguards, not with plain ``bare`` as the report's goal table does. For each ``system vs against``:
how many continuations equal the other's (and how many only run past its end), the steps summed over the quality
pass, and the end-to-end time per prompt of the latency pass summed and as a paired median (a run without a latency
pass gives the rest), and #33's end-to-end target for the summed time: at most 0.75x the bare LM's with the same
safeguards, and below in-context retrieval with prompt lookup (``bare-rag-lookup``).

    python experiments/drafting/matched_latency.py --run results/drafting/packed-200 \\
        --pairs "dynamic:verify=1:agree=1:uses=0:draft=8 vs bare,bare-rag-lookup vs bare"
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from evals.systems import parse_system

#: #33's end-to-end target: time per prompt (to one character budget) at most this against the bare LM
BARE_TARGET = 0.75


def records(path: Path) -> dict[tuple[str, str], dict]:
    """``(system, prompt id) -> record`` of a generations or latency file."""
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {(row["system"], row["id"]): row for row in rows}


def compare(generations: dict, latency: dict, system: str, against: str) -> dict:
    """Equal texts, steps ratio and time ratios of ``system`` against ``against``."""
    ids = sorted(i for s, i in generations if s == system and (against, i) in generations)
    texts = [(generations[system, i]["text"], generations[against, i]["text"]) for i in ids]
    timed = sorted(i for s, i in latency if s == system and (against, i) in latency)
    seconds = [(sum(latency[system, i]["latency"].values()), sum(latency[against, i]["latency"].values())) for i in timed]
    return {
        "prompts": len(ids),
        "equal": sum(a == b for a, b in texts),
        "past its end": sum(a != b and a.startswith(b) for a, b in texts),
        "steps": sum(generations[system, i]["steps"] for i in ids) / sum(generations[against, i]["steps"] for i in ids),
        "timed prompts": len(timed),
        "time summed": sum(a for a, _ in seconds) / sum(b for _, b in seconds) if seconds else None,
        "time paired median": statistics.median(a / b for a, b in seconds) if seconds else None,
    }


def verdict(system: str, against: str, ratio: float | None) -> str:
    """#33's end-to-end target for a dynamic ``system``'s ratio of summed times against ``against``: "-" where none
    applies or nothing was timed."""
    base = parse_system(against).base
    if ratio is None or parse_system(system).base != "dynamic" or base not in ("bare", "bare-rag-lookup"):
        return "-"
    if base == "bare-rag-lookup":
        return f"below 1: {'met' if ratio < 1 else f'missed by {ratio - 1:.3f}'}"
    return f"<= {BARE_TARGET}: {'met' if ratio <= BARE_TARGET else f'missed by {ratio - BARE_TARGET:.3f}'}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="an evaluation folder with generations.jsonl (and latency.jsonl)")
    parser.add_argument("--pairs", required=True,
                        help="comma-separated 'system vs against' pairs")
    args = parser.parse_args(argv)
    run = Path(args.run)
    timings = run / "latency.jsonl"
    generations, latency = records(run / "generations.jsonl"), records(timings) if timings.exists() else {}
    print("| system | against | equal texts (past its end) | steps | time per prompt, summed (paired median) | #33's target |")
    print("|---|---|---|---|---|---|")
    for pair in args.pairs.split(","):
        system, _, against = (name.strip() for name in pair.partition(" vs "))
        r = compare(generations, latency, system, against)
        time = f"{r['time summed']:.3f}x ({r['time paired median']:.3f}x), {r['timed prompts']} prompts" if r["timed prompts"] else "-"
        print(f"| `{system}` | `{against}` | {r['equal']} of {r['prompts']} ({r['past its end']}) | {r['steps']:.3f}x | {time} | "
              f"{verdict(system, against, r['time summed'])} |")


if __name__ == "__main__":
    main()
