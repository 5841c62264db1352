"""build-vocab, nar-train and nar-search on a tiny encoder and a JSONL of (query, docid) pairs."""

import json

import pytest

from dynvocab.cli import main

TITLES = ["red river", "blue river", "red mountain", "green valley", "blue lake", "old castle"]


def test_build_vocab_train_and_search(tmp_path, tiny_encoder_dir, capsys):
    (tmp_path / "docids.txt").write_text("\n".join(TITLES) + "\n")
    pairs = [{"query": f"{lead} {title}", "docid": title} for title in TITLES for lead in ("where is the", "about the")]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    main(["build-vocab", "--data", str(tmp_path / "docids.txt"), "--output", str(tmp_path / "vocab"), "--size", "40"])
    built = json.loads(capsys.readouterr().out)
    assert built["size"] <= 40 and built["docids"] == 6
    # subsets as large as the vocabulary: every docid stays reachable from the shortlist
    main(["nar-train", "--vocab", str(tmp_path / "vocab"), "--data", str(tmp_path / "pairs.jsonl"), "--encoder",
          str(tiny_encoder_dir), "--output-dir", str(tmp_path / "run"), "--max-steps", "2", "--batch-size", "4",
          "--cluster-steps", "2", "--clusters", "3", "--subset-size", "40", "--probe", "1"])
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert trained["pairs"] == 12 and trained["clusters"] == 3
    main(["nar-search", "--model", str(tmp_path / "run"), "--query", "where is the red river", "--shortlist", "--k", "3"])
    out = capsys.readouterr().out
    assert out.startswith("where is the red river") and " 1. " in out


def test_nar_search_without_a_run_exits_with_the_reason(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["nar-search", "--model", str(tmp_path / "missing"), "--query", "anything"])
    assert exit_info.value.code == 2
    assert "pass the --output-dir of `dynvocab nar-train`" in capsys.readouterr().err
