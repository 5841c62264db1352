import json

import numpy as np
import pytest

from dynvocab.cli import main
from dynvocab.data.assets import wikipedia_leads
from dynvocab.states.store import DocumentStateStore
from retrieval import DocumentIndex
from tests.helpers import launch


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_lm_dir, tiny_encoder_dir):
    root = tmp_path_factory.mktemp("cli")
    (root / "lm").symlink_to(tiny_lm_dir)
    (root / "encoder").symlink_to(tiny_encoder_dir)
    leads = wikipedia_leads()[:30]
    (root / "docs.jsonl").write_text("".join(json.dumps({"id": d["id"], "text": d["text"]}) + "\n" for d in leads))
    (root / "train.txt").write_text("\n\n".join(d["text"] for d in leads))
    return root


def test_index_train_generate(workspace, capsys):
    main(["index", "--data", str(workspace / "docs.jsonl"), "--output", str(workspace / "index"), "--encoder", str(workspace / "encoder")])
    main(["train", "--model", str(workspace / "lm"), "--data", str(workspace / "train.txt"), "--output-dir",
          str(workspace / "run"), "--mode", "frozen", "--max-steps", "2", "--batch-size", "2", "--max-length", "32",
          "--negatives", "in-batch,prefix"])
    assert json.loads((workspace / "run" / "final" / "train_config.json").read_text())["max_steps"] == 2
    main(["generate", "--index", str(workspace / "index"), "--model", str(workspace / "lm"), "--checkpoint",
          str(workspace / "run" / "final"), "--encoder", str(workspace / "encoder"), "--prompt", "The history of",
          "--top-k", "2", "--max-new-tokens", "6"])
    out = capsys.readouterr().out
    assert "indexed 30 documents" in out and "The history of" in out and "latency: retrieve" in out


def test_index_with_phrase_vectors_then_generate_reads_them(workspace, capsys):
    encoder = ["--encoder", str(workspace / "encoder")]
    main(["train", "--model", str(workspace / "lm"), "--data", str(workspace / "train.txt"), "--output-dir",
          str(workspace / "run-1"), "--mode", "frozen", "--max-steps", "1", "--batch-size", "2", "--max-length", "32"])
    lm = ["--model", str(workspace / "lm"), "--checkpoint", str(workspace / "run-1" / "final")]
    capsys.readouterr()
    index = workspace / "index-with-phrases"
    main(["index", "--data", str(workspace / "docs.jsonl"), "--output", str(index), *encoder, "--phrase-vectors", *lm,
          "--shard-documents", "8"])
    built = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert built["documents"] == 30 and built["phrases"] > 100 and built["phrase_vectors"].endswith("phrase_vectors")
    main(["phrase-vectors", "--index", str(index), *encoder, *lm, "--shard-documents", "8"])  # done: nothing to add
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["phrases"] == built["phrases"]
    with pytest.raises(SystemExit) as exit_info:  # other extraction settings: another store
        main(["phrase-vectors", "--index", str(index), *encoder, *lm, "--max-length", "4"])
    assert exit_info.value.code == 2 and "--overwrite" in capsys.readouterr().err


def test_document_states_beside_an_index_are_built_once(workspace, capsys):
    encoder, lm = ["--encoder", str(workspace / "encoder")], ["--model", str(workspace / "lm")]
    index = workspace / "index-with-states"
    main(["index", "--data", str(workspace / "docs.jsonl"), "--output", str(index), *encoder, "--document-states", *lm,
          "--shard-documents", "8", "--states-batch-size", "4"])
    built = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert built["documents"] == 30 and built["tokens"] > 30 * 20
    assert built["document_states"].endswith("document_states")
    main(["document-states", "--index", str(index), *encoder, *lm, "--shard-documents", "8"])  # done: nothing to add
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == built
    with pytest.raises(SystemExit) as exit_info:  # another dtype: another store
        main(["document-states", "--index", str(index), *encoder, *lm, "--shard-documents", "8", "--dtype", "float32"])
    assert exit_info.value.code == 2 and "--overwrite" in capsys.readouterr().err
    main(["document-states", "--index", str(index), *encoder, *lm, "--dtype", "float32", "--overwrite"])
    assert DocumentStateStore(built["document_states"]).record["dtype"] == "float32"


def test_bad_settings_exit_with_the_reason(workspace, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--model", str(workspace / "lm"), "--mode", "half"])
    assert exit_info.value.code == 2
    assert "mode='half'" in capsys.readouterr().err


def test_flags_are_typed_from_the_config_fields_under_both_spellings():
    from dynvocab.cli import build_parser

    args = build_parser().parse_args(["train", "--max-steps", "3", "--learning_rate", "0.5", "--mode", "frozen"])
    assert (args.max_steps, args.learning_rate, args.mode, args.batch_size) == (3, 0.5, "frozen", 8)
    args = build_parser().parse_args(["generate", "--index", "i", "--prompt", "p", "--max-chars", "40", "--do-sample"])
    assert (args.max_chars, args.do_sample, args.realtime) == (40, True, False)


def test_every_command_prints_its_help(capsys):
    from dynvocab.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name in commands:  # a help string with a bare % breaks argparse's formatting
        with pytest.raises(SystemExit) as stop:
            parser.parse_args([name, "--help"])
        assert stop.value.code == 0, name
        assert "usage: dynvocab " + name in capsys.readouterr().out


def test_cache_states_then_train_from_the_cache(workspace, capsys):
    main(["cache-states", "--model", str(workspace / "lm"), "--data", str(workspace / "train.txt"), "--max-length", "32",
          "--output-dir", str(workspace / "states")])
    built = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert built["chunks"] > 30 and "--state-cache" in built["train_with"]
    main(["train", "--model", str(workspace / "lm"), "--data", str(workspace / "train.txt"), "--output-dir",
          str(workspace / "cached-run"), "--state-cache", str(workspace / "states"), "--max-steps", "2", "--batch-size",
          "2", "--max-length", "32", "--negatives", "in-batch,prefix,same-text"])
    assert json.loads((workspace / "cached-run" / "final" / "dynvocab_config.json").read_text())["trained_readback"] == "tokens"
    with pytest.raises(SystemExit) as exit_info:  # the cache is of 32-token chunks: another length is another cache
        main(["train", "--model", str(workspace / "lm"), "--data", str(workspace / "train.txt"), "--output-dir",
              str(workspace / "stale-run"), "--state-cache", str(workspace / "states"), "--max-length", "16"])
    assert exit_info.value.code == 2
    assert "max_length 32 (wanted 16)" in capsys.readouterr().err


def test_index_of_an_embedded_corpus_leaves_the_held_out_part_out_and_eval_refuses_one_that_has_it(workspace, capsys):
    from dynvocab.data.corpora import corpus_split
    from retrieval import DocumentIndex

    training, held_out = corpus_split("licenses")
    encoder = ["--encoder", str(workspace / "encoder")]
    main(["index", "--data", "licenses", "--output", str(workspace / "clean"), *encoder])
    assert f"the training part of licenses: its {len(held_out)} held-out documents" in capsys.readouterr().out
    main(["index", "--data", "licenses", "--include-held-out", "--output", str(workspace / "leaky"), *encoder])
    assert "held-out documents included" in capsys.readouterr().out
    held_ids = {d["id"] for d in held_out}
    assert not held_ids & {d["id"] for d in DocumentIndex.load(workspace / "clean").documents}
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--data", "licenses", "--index", str(workspace / "leaky"), *encoder, "--model", str(workspace / "lm"),
              "--systems", "dynamic-untrained", "--num-prompts", "1", "--output-dir", str(workspace / "eval")])
    assert exit_info.value.code == 2
    assert "held-out licenses documents the evaluation prompts with" in capsys.readouterr().err


def test_index_encoded_in_shards_by_two_processes_is_the_index_of_one(workspace, capsys):
    common = ["--data", str(workspace / "docs.jsonl"), "--encoder", str(workspace / "encoder"), "--index-type", "flat"]
    main(["index", *common, "--output", str(workspace / "index-one")])
    out = launch(workspace, "index", *common, "--output", str(workspace / "index-two"), "--shards",
                 str(workspace / "shards-two"))
    reports = [json.loads(line) for line in out.splitlines() if line.startswith('{"process"')]
    assert sorted((r["process"], r["shards_encoded"], r["documents"]) for r in reports) == [(0, [0], 15), (1, [1], 15)]
    one, two = (DocumentIndex.load(workspace / name) for name in ("index-one", "index-two"))
    assert [d["id"] for d in two.documents] == [d["id"] for d in one.documents]
    np.testing.assert_allclose(two.exact_search(one._cpu_index.reconstruct_n(0, 30), 1)[1][:, 0], np.arange(30))


def test_one_machine_encodes_its_shard_and_a_later_run_encodes_the_rest_and_merges(workspace, capsys):
    common = ["index", "--data", str(workspace / "docs.jsonl"), "--encoder", str(workspace / "encoder"), "--output",
              str(workspace / "index-three"), "--shards", str(workspace / "shards-three"), "--num-shards", "3"]
    main([*common, "--shard", "1"])
    out = capsys.readouterr().out
    assert '"shards_encoded": [1], "documents": 10' in out and "2 still missing" in out
    assert not (workspace / "index-three").exists()
    main(common)
    out = capsys.readouterr().out
    assert '"shards_encoded": [0, 2], "documents": 20' in out and "from 3 shards" in out
    assert len(DocumentIndex.load(workspace / "index-three")) == 30
