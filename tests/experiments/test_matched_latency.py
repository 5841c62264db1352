"""experiments/drafting/matched_latency.py on a hand-made run: equal texts, steps, times and #33's verdicts."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("matched_latency", ROOT / "experiments/drafting/matched_latency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_drafting_is_judged_against_the_bare_lm_and_prompt_lookup(tmp_path, capsys):
    drafted, bare, lookup = "dynamic:verify=1:draft=8", "bare", "bare-rag-lookup"
    texts = {drafted: ["a b", "c d e"], bare: ["a b", "c d"], lookup: ["x", "y"]}
    steps = {drafted: [5, 5], bare: [10, 10], lookup: [10, 10]}
    seconds = {drafted: [0.6, 1.0], bare: [1.0, 1.0], lookup: [0.7, 0.7]}
    write(tmp_path / "generations.jsonl", [{"system": s, "id": i, "text": texts[s][i], "steps": steps[s][i]}
                                          for s in texts for i in range(2)])
    write(tmp_path / "latency.jsonl", [{"system": s, "id": i, "latency": {"decode": seconds[s][i]}}
                                       for s in seconds for i in range(2)])
    matched = load()
    result = matched.compare(*[matched.records(tmp_path / f) for f in ("generations.jsonl", "latency.jsonl")], drafted, bare)
    assert (result["equal"], result["past its end"], result["steps"], result["time summed"]) == (1, 1, 0.5, 0.8)
    matched.main(["--run", str(tmp_path), "--pairs", f"{drafted} vs {bare},{drafted} vs {lookup},{lookup} vs {bare}"])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert rows[0].endswith("| <= 0.75: missed by 0.050 |")
    assert rows[1].endswith("| below 1: missed by 0.143 |")  # 1.6 s against 1.4 s
    assert rows[2].endswith("| - |")  # the target is the dynamic model's
    assert matched.verdict(drafted, bare, 0.7) == "<= 0.75: met" and matched.verdict(drafted, lookup, 0.99) == "below 1: met"
