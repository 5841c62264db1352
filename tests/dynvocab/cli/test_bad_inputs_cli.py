"""The command line's bad-input catalogue: a user error prints one line naming it and exits 2, never a traceback."""

import pytest

from dynvocab.cli import main


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("x")
    return path


CASES = [
    ("train an unknown mode", ["train", "--mode", "half"], "mode='half'"),
    ("train zero steps", ["train", "--max-steps", "0"], "max_steps=0 must be >= 1"),
    ("train an unknown negative", ["train", "--negatives", "prefix,psychic"], "psychic"),
    ("train a held-out share of 2", ["train", "--held-out", "2"], "fraction"),
    ("train a negative checkpoint limit", ["train", "--save-total-limit", "-1"], "keeps every checkpoint"),
    ("train a missing data file", ["train", "--data", "/no/such/corpus.jsonl", "--model", "/no/such/lm"], "corpus.jsonl"),
    ("train a missing model path", ["train", "--model", "./no/such/lm", "--data", "{a_file}"], "does not exist"),
    ("train into an existing file", ["train", "--output-dir", "{a_file}"], "is an existing file"),
    ("train-mwt zero steps", ["train-mwt", "--max-steps", "0"], "max_steps"),
    ("index a missing data file", ["index", "--data", "/no/such/docs.jsonl", "--output", "{tmp}/idx"], "does not exist"),
    ("index a missing encoder path", ["index", "--data", "{a_file}", "--output", "{tmp}/idx", "--encoder", "./no/enc"],
     "does not exist"),
    ("generate a missing index", ["generate", "--index", "/no/such/index", "--prompt", "Hi"], "no saved index"),
    ("generate an empty prompt", ["generate", "--index", "/no/such/index", "--prompt", ""], "prompt 0 is empty"),
    ("generate a blank second prompt", ["generate", "--index", "/x", "--prompt", "Hi", "--prompt", " "],
     "prompt 1 is empty"),
    ("generate top-k 0", ["generate", "--index", "/no/such/index", "--prompt", "Hi", "--top-k", "0"], "top_k=0"),
    ("generate a temperature of 0", ["generate", "--index", "/x", "--prompt", "Hi", "--temperature", "0"], "temperature"),
    ("generate min > max length", ["generate", "--index", "/x", "--prompt", "Hi", "--min-length", "5", "--max-length",
                                   "2"], "min_length=5 > max_length=2"),
    ("generate drafts unverified", ["generate", "--index", "/x", "--prompt", "Hi", "--no-grounded", "--draft-tokens", "8"],
     "needs verified decoding: pass grounded=True"),
    ("phrase-vectors a missing index", ["phrase-vectors", "--index", "/no/such/index"], "no saved index"),
    ("phrase-vectors zero documents a shard", ["phrase-vectors", "--index", "/x", "--shard-documents", "0"],
     "--shard-documents 0 must be >= 1"),
    ("phrase-vectors an unknown edge rule", ["phrase-vectors", "--index", "/x", "--edges", "inner"], "invalid choice"),
    ("document-states a missing index", ["document-states", "--index", "/no/such/index"], "no saved index"),
    ("document-states zero documents a shard", ["document-states", "--index", "/x", "--shard-documents", "0"],
     "--shard-documents 0 and --batch-size 8 must be >= 1"),
    ("index with document states read in batches of 0", ["index", "--output", "{tmp}/i", "--document-states",
                                                         "--states-batch-size", "0"], "--states-batch-size 0 must be"),
    ("document-states in bfloat16", ["document-states", "--index", "/x", "--dtype", "bfloat16"], "invalid choice"),
    ("soup-encoders a base weight of 1", ["soup-encoders", "--encoders", "a", "--output", "{tmp}/s", "--base", "minilm",
                                          "--base-weight", "1"], "base_weight=1.0 must be in [0, 1)"),
    ("extract-adapter a rank of 0", ["extract-adapter", "--encoder", "{tmp}", "--output", "{tmp}/a", "--rank", "0"],
     "rank=0 must be a positive int"),
    ("extract-adapter a missing encoder", ["extract-adapter", "--encoder", "/no/such/encoder", "--output", "{tmp}/a"],
     "does not exist"),
    ("eval an unknown system", ["eval", "--systems", "bare,psychic"], "psychic"),
    ("eval an unknown system option", ["eval", "--systems", "dynamic:readback=bytes"], "readback"),
    ("eval no systems", ["eval", "--systems", ""], "names no system"),
    ("eval development prompts below 0", ["eval", "--skip_prompts", "-1"], "skip_prompts"),
    ("eval-qa an unknown n-gram scope", ["eval-qa", "--no_repeat_ngram_scope", "answer"], "choose 'all'"),
    ("qa an unknown n-gram scope", ["qa", "--question", "Why?", "--no_repeat_ngram_scope", "answer"], "choose 'all'"),
    ("demo zero prompts", ["demo", "--prompts", "0"], "must be >= 1"),
    ("index a shard past the last", ["index", "--data", "{a_file}", "--output", "{tmp}/i", "--shards", "{tmp}/s",
                                     "--num-shards", "2", "--shard", "2"], "--shard 2 does not exist in --num-shards 2"),
    ("index zero shards", ["index", "--data", "{a_file}", "--output", "{tmp}/i", "--shards", "{tmp}/s",
                           "--num-shards", "0"], "--num-shards 0 must be >= 1"),
    ("pseudo-queries none a document", ["pseudo-queries", "--output", "{tmp}/q.jsonl", "--per-document", "0"],
     "--per-document 0 and --batch-size 32 must be >= 1"),
    ("eval an unknown corpus", ["eval", "--data", "news"], "choose one of wikipedia, licenses, licensedb"),
    ("eval-qa grounded and verified", ["eval-qa", "--systems", "ngram:verify=1:gamma=0.5"], "drop :verify"),
    ("qa grounded with verification", ["qa", "--question", "Why?", "--verify_top_k", "1"],
     "pass grounded=False for verify_top_k=1"),
]


@pytest.mark.parametrize(("argv", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_user_error_prints_one_line_and_exits_2(argv, fragment, a_file, tmp_path, capsys):
    argv = [a.format(a_file=a_file, tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    message = [line for line in err.splitlines() if line.startswith("dynvocab") or "error:" in line]
    assert message and fragment in message[-1], err


@pytest.mark.parametrize("argv", [["no-such-command"], ["train", "--max-steps", "many"], ["index"]])
def test_argument_errors_exit_2_from_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "Traceback" not in capsys.readouterr().err
