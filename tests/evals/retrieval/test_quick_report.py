"""The eval-retrieval report's target lines: 'met' only beyond the seed spread, misses quantified."""

from evals.retrieval.quick_report import target_lines, write_quick_markdown

FANOUT = "FanOutQA sub-questions"


def _record(both: list[float], minilm: list[float]) -> dict:
    systems = {}
    for seed, (b, m) in enumerate(zip(both, minilm)):
        for name, value in (("DupMAE+FT both", b), ("MiniLM fine-tuned", m), ("DupMAE+FT cls", b - 0.1),
                            ("DupMAE+FT ot", b - 0.1)):
            systems[f"{name}, seed {seed}"] = {FANOUT: {"mrr@10": value}}
    systems["MiniLM as shipped"] = {FANOUT: {"mrr@10": 0.1}}
    systems["DupMAE+FT both, seed 0"].update({"index_bytes": 7, f"{FANOUT} ms/query": 0.25,
                                             f"{FANOUT} default index mrr@10": 0.5, f"{FANOUT} top-10 vs exhaustive": 0.975})
    pruning = {"candidates": 32, "query_terms": 16, "posting_terms": 32}
    bench = [{"index": "hybrid CLS:384/OT:384", "latency_vs_dense384": 2.5, **pruning},
             {"index": "hybrid CLS:384/OT:260", "latency_vs_dense384": 1.5, "bytes_vs_dense768": 1.18, **pruning}]
    return {"systems": systems, "benchmark": bench, "config": {"benchmark_documents": 10},
            "pretraining": {"sequences_per_s": 1.5, "steps": 3}, "versions": {"torch_threads": "2"}}


def test_a_gap_inside_the_seed_spread_is_missed_by_the_difference():
    lines = target_lines(_record(both=[0.30, 0.40, 0.35], minilm=[0.33, 0.34, 0.32]))
    minilm = next(line for line in lines if "ahead of MiniLM fine-tuned" in line)
    assert "gap +0.0200, spread 0.1000: MISSED by 0.0800" in minilm
    assert "MISSED" in next(line for line in lines if "ahead of DupMAE+FT cls" in line), "a gap equal to the spread is not met"
    assert "MISSED by 0.50x" in next(line for line in lines if "OT:384 search latency" in line)
    assert "1.180x: MISSED by 0.080" in lines[-2]
    assert not any("Only" in line for line in lines)


def test_one_seed_is_flagged_and_a_clear_gap_is_met(tmp_path):
    record = _record(both=[0.5], minilm=[0.3])
    lines = target_lines(record)
    assert lines[0].startswith("- Only 1 seed(s) here") and "spread 0.0000: met" in lines[1]
    report = write_quick_markdown({**record, "command": "x", "documents": 3, "queries": {}, "config": {
        "corpus": "wikipedia", "pretrain_steps": 1, "pretrain_batch_size": 1, "pretrain_max_length": 8, "finetune_steps": 1,
        "batch_size": 2, "seeds": "0", "benchmark_documents": 10}, "benchmark": [
        {**row, "bytes": 1, "ms_per_query": 1.0, "bytes_vs_dense768": row.get("bytes_vs_dense768", 1.0)}
        for row in record["benchmark"]], "pretraining": {**record["pretraining"], "seconds": 2.0, "first_losses": {},
                                                       "final_losses": {}}}, tmp_path / "report.md")
    text = report.read_text()
    assert "cores may be shared" in text
    assert f"| DupMAE+FT both, seed 0 | 7 | {FANOUT}: 0.25 | {FANOUT}: 0.5000 | {FANOUT}: 97.5% |" in text
    assert "each document's 32 heaviest entries, walked for the query's 16" in text
