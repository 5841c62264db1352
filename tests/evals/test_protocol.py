import json

import pytest
from transformers import AutoModelForCausalLM

from dynvocab import DynamicVocabLM
from dynvocab.cli import main
from dynvocab.demo import corpus_split


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_lm_dir, tiny_encoder_dir, _gpt2_tokenizer):
    root = tmp_path_factory.mktemp("eval")
    (root / "lm").symlink_to(tiny_lm_dir)
    (root / "doc-encoder").symlink_to(tiny_encoder_dir)
    lm = AutoModelForCausalLM.from_pretrained(tiny_lm_dir)
    DynamicVocabLM.from_causal_lm(lm, _gpt2_tokenizer).save_pretrained(root / "encoder-ckpt")
    docs = corpus_split("wikipedia")[0][:40]
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    main(["index", "--data", str(root / "docs.jsonl"), "--output", str(root / "index"), "--encoder", str(root / "doc-encoder")])
    return root


def eval_args(root, **extra):
    args = ["eval", "--model", str(root / "lm"), "--checkpoint", str(root / "encoder-ckpt"), "--index", str(root / "index"),
            "--encoder", str(root / "doc-encoder"), "--systems", "bare,dynamic,dynamic-no-phrases", "--num-prompts", "12",
            "--prefix-tokens", "8", "--continuation-tokens", "8", "--top-k-docs", "4", "--mauve-featurizer", "lm",
            "--mauve-seeds", "2", "--output-dir", str(root / "out")]
    return args + [item for pair in extra.items() for item in pair]


def test_eval_writes_every_figure_and_resumes(workspace, capsys):
    main(eval_args(workspace))
    results = json.loads((workspace / "out" / "results.json").read_text())
    assert set(results["results"]) == {"bare", "dynamic", "dynamic-no-phrases"}
    bare, no_phrases = results["results"]["bare"], results["results"]["dynamic-no-phrases"]
    assert bare["steps_per_sequence"] == 8 and bare["phrase_share"] == 0
    assert no_phrases["phrase_share"] == 0
    assert 0 <= results["results"]["dynamic"]["mauve"] <= 100
    assert results["config"]["num_prompts"] == 12 and "command" in results
    assert (workspace / "out" / "latency.png").stat().st_size > 0
    assert "| bare |" in (workspace / "out" / "report.md").read_text()
    lines = (workspace / "out" / "generations.jsonl").read_text().splitlines()
    assert len(lines) == 36
    main(eval_args(workspace))  # resumed: nothing is generated again
    assert (workspace / "out" / "generations.jsonl").read_text().splitlines() == lines
    records = [json.loads(line) for line in lines]
    bare = {r["id"]: r["text"] for r in records if r["system"] == "bare"}
    for record in records:  # with no phrases the dynamic model is the bare LM (it stops by characters instead)
        if record["system"] == "dynamic-no-phrases":
            assert bare[record["id"]].startswith(record["text"]) or record["text"].startswith(bare[record["id"]])
