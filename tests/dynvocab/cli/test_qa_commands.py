"""`dynvocab qa` and `dynvocab eval-qa` on a tiny random model: answers, a resumable run, its report."""

import json

import pytest
import torch

from dynvocab.cli import main

ASQA = [
    {"sample_id": str(i), "question": question, "qa_pairs": [{"short_answers": [answer]}],
     "docs": [{"title": "Seine", "text": "The Seine flows through Paris and into the English Channel."},
              {"title": "Tokyo", "text": "Tokyo is the capital of Japan and its largest city."}]}
    for i, (question, answer) in enumerate([("Which river flows through Paris?", "Seine"),
                                            ("What is the capital of Japan?", "Tokyo"),
                                            ("Where does the Seine end?", "English Channel")])
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_lm_dir):
    root = tmp_path_factory.mktemp("qa-cli")
    (root / "asqa.json").write_text(json.dumps(ASQA))
    return root


def test_qa_answers_with_given_documents(workspace, tiny_lm_dir, capsys):
    main(["qa", "--model", str(tiny_lm_dir), "--question", "Which river flows through Paris?", "--document",
          "Seine: The Seine flows through Paris.", "--document", "Tokyo: Tokyo is the capital of Japan.",
          "--max-new-tokens", "4"])
    out = capsys.readouterr().out
    assert out.startswith("Q: Which river flows through Paris?\nA: ")
    assert "[1] Seine" in out and "[2] Tokyo" in out and "steps were phrases" in out


def test_eval_qa_writes_a_report_and_resumes(workspace, tiny_lm_dir, capsys):
    argv = ["eval-qa", "--data", str(workspace / "asqa.json"), "--model", str(tiny_lm_dir), "--systems",
            "bare@2,ngram@2,ngram-nomark@2,content@1", "--max-new-tokens", "4", "--output-dir", str(workspace / "run")]
    main(argv + ["--num-questions", "2"])
    lines = (workspace / "run" / "generations.jsonl").read_text().splitlines()
    assert len(lines) == 8 and {json.loads(line)["system"] for line in lines} == {"bare@2", "ngram@2", "ngram-nomark@2",
                                                                                  "content@1"}
    main(argv)  # the third question only
    lines = (workspace / "run" / "generations.jsonl").read_text().splitlines()
    assert len(lines) == 12
    results = json.loads((workspace / "run" / "results.json").read_text())
    assert set(results["systems"]) == {"bare@2", "ngram@2", "ngram-nomark@2", "content@1"}
    assert results["systems"]["bare@2"]["questions"] == 3 and results["systems"]["bare@2"]["phrase_share"] == 0
    for name in ("ngram@2", "ngram-nomark@2", "content@1"):
        assert results["systems"][name]["phrases_per_question"] > 0
    report = (workspace / "run" / "report.md").read_text()
    assert "Command: `dynvocab eval-qa" in report and "## Targets" in report and "no NLI model was given" in report
    assert "answer support precision >= 60%" in report and "STR-EM not below bare@2" in report
    assert "citation_recall" not in results["systems"]["ngram@2"] and "## Where the phrase systems lose" in report
    assert results["generation_threads"] == [torch.get_num_threads()] and results["answers_without_threads"] == 0
    assert f"min on {torch.get_num_threads()} torch threads." in report
    capsys.readouterr()


def test_eval_qa_refuses_to_mix_settings_in_one_output_dir(workspace, tiny_lm_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval-qa", "--data", str(workspace / "asqa.json"), "--model", str(tiny_lm_dir), "--systems", "bare@2",
              "--max-new-tokens", "5", "--output-dir", str(workspace / "run")])
    assert exit_info.value.code == 2 and "max_new_tokens=4" in capsys.readouterr().err


QA_CASES = [
    ("qa top-k 0", ["qa", "--question", "Q?", "--top-k", "0"], "top_k=0"),
    ("qa unknown phrases", ["qa", "--question", "Q?", "--phrases", "parsed"], "phrases='parsed'"),
    ("qa an empty document", ["qa", "--question", "Q?", "--document", "Title: "], "has no text"),
    ("eval-qa unknown system", ["eval-qa", "--systems", "bare@3,psychic@3"], "psychic@3"),
    ("eval-qa zero documents", ["eval-qa", "--systems", "ngram@0"], "at least 1"),
    ("eval-qa a system twice", ["eval-qa", "--systems", "bare@3,bare@3"], "twice"),
    ("eval-qa a missing ASQA file", ["eval-qa", "--data", "/no/such/asqa.json"], "asqa.json"),
    ("eval-qa oracle on ASQA", ["eval-qa", "--data", "{asqa}", "--systems", "bare@3+oracle"], "oracle"),
]


@pytest.mark.parametrize(("argv", "fragment"), [c[1:] for c in QA_CASES], ids=[c[0] for c in QA_CASES])
def test_a_qa_user_error_prints_one_line_and_exits_2(argv, fragment, workspace, capsys):
    argv = [a.replace("{asqa}", str(workspace / "asqa.json")) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and fragment in err and "Traceback" not in err
