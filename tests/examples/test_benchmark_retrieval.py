from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "benchmark_retrieval.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("benchmark_retrieval_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_arguments_parse_into_the_config():
    example = _load_example()
    assert example.parse_args([]) == example.BenchmarkConfig()
    full = example.parse_args(["--full", "--k", "16", "--no-smollm2"])
    assert (full.num_docs, full.num_queries, full.k, full.smollm2) == (0, 310, 16, False)
    with pytest.raises(ValueError, match="k=0"):
        example.parse_args(["--k", "0"])


@pytest.mark.slow
def test_main_runs_on_tiny_settings(monkeypatch, capsys):
    example = _load_example()
    argv = ["--num-docs", "64", "--num-queries", "8", "--k", "8", "--phrase-batches", "2", "--no-smollm2"]
    monkeypatch.setattr(sys, "argv", ["benchmark_retrieval.py", *argv])
    results = example.main()
    out = capsys.readouterr().out
    assert "recall@8 against flat" in out and "phrase extraction (gpt2 tokenizer)" in out
    assert 0.0 <= results["recall_ivf"] <= 1.0 and results["search_flat_ms"] > 0
    assert "docs cut afresh" in out and "docs cut before" in out and results["phrases_gpt2_seen_ms"] > 0
