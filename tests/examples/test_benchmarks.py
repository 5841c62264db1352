"""Each benchmark script's main() runs end to end on a tiny model (the real figures come from the README's commands)."""

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_core_benchmark(tiny_lm_dir, capsys):
    results = load("benchmark_core").main(["--tiny", "--model", str(tiny_lm_dir), "--threads", "1"])
    assert results["round_trips"] == 200
    assert results["encode_phrases_per_s"] > 0 and results["step_ratio_1000"] > 0
    assert "(b) per-step time at |P|=1000" in capsys.readouterr().out


def test_training_benchmark(tiny_lm_dir, capsys):
    results = load("benchmark_training").main(["--tiny", "--model", str(tiny_lm_dir), "--threads", "1"])
    assert results["plain_s"] > 0 and results["peak_gb"] > 0
    assert "negatives add" in capsys.readouterr().out


def test_shortlist_benchmark(tiny_lm_dir, tmp_path, capsys):
    benchmark = load("benchmark_shortlist")
    results = benchmark.main(["--tiny", "--model", str(tiny_lm_dir), "--checkpoint", "none", "--threads", "1", "--ungrouped",
                              "--output", str(tmp_path / "results.json")])
    assert results["steps_3000"]["shortlist"]["ratio"] > 0 and results["clusters_3000"] > 1
    assert 0 <= results["agreement_3000"][4]["recall10"] <= 1 and 0 <= results["ungrouped_agreement_3000"][8]["agree"] <= 1
    assert results["agreement_3000"][4]["candidates"] > results["agreement_3000"][2]["candidates"]  # more probes, more ids
    assert set(results["memory_gb"]) == {"table_and_vectors", "head"}
    assert "|P|=3000" in capsys.readouterr().out
    report = (tmp_path / "results.md").read_text()
    assert "| shortlist | 3000 |" in report and "whole-table k-means" in report


def test_shortlist_benchmark_reports_33s_targets_met_or_missed():
    benchmark = load("benchmark_shortlist")
    results = {"settings": {"probe": 96},
               "steps_100000": {"shortlist": {"ratio": 1.062}}, "agreement_100000": {"96": {"agree": 1.0}},
               "steps_1000000": {"shortlist": {"ratio": 1.101}}, "agreement_1000000": {96: {"agree": 0.985}}}
    small, large = benchmark.targets(results)
    assert "1.062x (target <= 1.05: missed by 0.012)" in small and "1.0000 (target >= 0.99: met)" in small
    assert "1.101x (target <= 1.15: met)" in large and "0.9850 (target >= 0.99: missed)" in large
    del results["steps_1000000"]
    assert len(benchmark.targets(results)) == 1


@pytest.mark.slow
def test_nar_experiment(tmp_path):
    report = load("nar_experiment").main(["--tiny", "--output", str(tmp_path / "out"), "--runs", str(tmp_path / "runs")])
    assert report["beam_search"]["identical"] and "phrase / learned shortlist" in report["systems"]
    change, low, high = report["systems"]["phrase / learned shortlist"]["held-out sentences"]["mrr@10 vs full"]
    assert low <= change <= high
    assert "phrase / V=20000 learned shortlist" in report["systems"] and "V=20000 centroid shortlist batch 16" in report["latency"]
    assert (tmp_path / "out" / "report.md").read_text().startswith("# NAR generative retrieval")


@pytest.mark.slow
def test_phrase_cache_benchmark(capsys):
    """Real assets (SmolLM2, the demo index): two warm-up and two measured prompts."""
    result = load("benchmark_phrase_cache").main(["--warmup-prompts", "2", "--num-prompts", "2"])
    assert result["prompts"] == 2 and result["encode"]["cache"]["mean_s"] > 0 and "cache" in result["ratios"]
    assert 0.0 <= result["cache"]["hit_rate"] <= 1.0 and "hit rate" in capsys.readouterr().out


@pytest.mark.slow
def test_decode_step_profile(capsys):
    """Real assets: one prompt, four steps, the state gate on; the dynamic model emits no phrase, so its tokens are
    the bare LM's."""
    result = load("profile_decode_step").main(["--num-prompts", "1", "--steps", "4", "--top", "5", "--linear", "plain",
                                               "--state-threshold", "0.9"])
    assert result["bare_s"] > 0 and result["dynamic_s"] > 0 and result["differ"] == 0
    out = capsys.readouterr().out
    assert "own time" in out and "State keys per prompt" in out and "state gate at 0.9" in out


def test_cpu_kernels_benchmark(tiny_lm_dir, capsys):
    figures = load("benchmark_cpu_kernels").main(["--model", str(tiny_lm_dir), "--rounds", "1", "--prompts", "2", "--steps", "3"])
    assert set(figures["forward_ms"]) == {"packed", "plain"} and figures["forward_over_one_token"]["plain"][1] == 1.0
    assert figures["greedy_equal_tokens"] == "2/2" and figures["greedy_packed_over_plain"] > 0
    assert '"forward_packed_over_plain"' in capsys.readouterr().out


def test_cpu_kernels_benchmark_compares_the_grouped_attention_with_transformers_sdpa(tiny_lm_dir):
    figures = load("benchmark_cpu_kernels").main(["--model", str(tiny_lm_dir), "--compare", "attention", "--rounds",
                                                  "1", "--prompts", "2", "--steps", "4", "--context-tokens", "16",
                                                  "--prompt-chars", "400", "--lookup", "3"])
    assert set(figures["forward_ms"]) == {"grouped", "sdpa"} and figures["compared"] == "grouped over sdpa"
    assert figures["greedy_equal_tokens"] == "2/2" and figures["greedy_grouped_over_sdpa"] > 0


def test_serving_benchmark(tiny_lm_dir, tmp_path, capsys):
    results = load("benchmark_serving").main(["--model", str(tiny_lm_dir), "--index", "none", "--num-prompts", "3",
                                              "--max-tokens", "4", "--concurrency", "1,2", "--max-queue", "2",
                                              "--threads", "1", "--state-threshold", "0.5", "--draft-tokens", "4",
                                              "--waiting", "--read-both", "--output", str(tmp_path)])
    modes = ("phrases", "bare", "gated", "drafted", "waiting", "read-both")
    assert set(results["levels"]) == {f"{mode} {level}" for mode in modes for level in ("first", "paired", "c=1", "c=2")}
    assert all(level["answered"] == 3 and level["5xx"] == 0 for level in results["levels"].values())
    assert results["levels"]["bare c=2"]["equal_to_lone"] == 3  # greedy: batched answers equal the lone ones
    assert results["levels"]["gated c=2"]["equal_to_lone"] == 3
    assert results["levels"]["phrases c=2"]["equal_to_lone"] == results["levels"]["waiting c=2"]["equal_to_lone"] == 3
    assert results["levels"]["read-both c=2"]["equal_to_lone"] == results["levels"]["read-both first"]["equal_to_phrases"] == 3
    drafted = results["levels"]["drafted c=2"]
    assert drafted["equal_to_lone"] == drafted["bare_lm_text"] == 3 and drafted["ms_per_char"] > 0  # lossless
    burst = results["burst"]
    assert burst["ok"] + burst["refused_503"] == burst["sent"] == 6 and burst["other"] == 0
    assert burst["refused_with_retry_after"] == burst["refused_503"]
    assert results["levels"]["bare paired"]["per_char_over_bare"] == 1.0
    assert results["levels"]["drafted paired"]["per_char_over_bare"] > 0
    assert "| phrases c=2 |" in (tmp_path / "benchmark.md").read_text()


def test_index_build_benchmark(tiny_encoder_dir, tmp_path, capsys):
    benchmark = load("benchmark_index_build")
    common = ["--passages", "300", "--words", "20", "--encoder", str(tiny_encoder_dir), "--queries", "20", "--workdir",
              str(tmp_path), "--pq-m", "4,8"]
    report = benchmark.main([*common, "--processes", "1"])
    assert report["builds"][0]["documents"] == 300 and report["builds"][0]["encoding_docs_per_s"] > 0
    rows = {(row["index"], row["pq_m"], row["nprobe"]): row for row in report["indexes"]}
    assert rows[("flat", None, None)]["recall@10"] == 1.0
    assert rows[("ivfpq", 4, 1)]["bytes"] < rows[("ivfpq", 8, 1)]["bytes"] < rows[("ivf", None, 1)]["bytes"]
    largest = max(nprobe for kind, _, nprobe in rows if kind == "ivf")
    assert rows[("ivf", None, largest)]["recall@10"] == 1.0  # every list probed: exact
    again = benchmark.main([*common, "--from-shards", "1"])  # the shards of that run, compared again without a build
    assert again["builds"] == [] and again["indexes"] == [{**row, "ms_per_query": row2["ms_per_query"]}
                                                          for row, row2 in zip(report["indexes"], again["indexes"])]


def test_pseudo_query_docids_map_every_docid_to_its_lead():
    docids, lead_of, queries, targets = load("nar_experiment").pseudo_query_docids(
        [["who built the bridge", "bridge builder"], [], ["who built the bridge", "river city"]],
        ["Bridge", "Empty", "River"], ["a sentence of lead 0", "a sentence of lead 2"], [0, 2], augment=20, seed=0)
    assert docids == ["who built the bridge", "bridge builder", "Empty", "river city"]  # shared string: first lead's
    assert lead_of.tolist() == [0, 0, 1, 2]
    assert queries[:2] == ["a sentence of lead 0", "a sentence of lead 2"] and targets[1] == 3
    assert targets[0] in (0, 1)
    assert sorted(zip(queries[2:], targets[2:])) == [("bridge builder", 0), ("who built the bridge", 1)]
