"""results/ is a tree a reader can walk from the docs, and the docs cite only what is there.

The tree:

- a *topic folder* is a folder directly under ``results/`` (``results/qa/``, ``results/wikipedia/``, ...). It holds a
  README.md that says which run is current for what and links each of its runs, and nothing else but run folders;
- a *run folder* is a folder directly under a topic folder (``results/qa/grounded/``). It holds the files one run (or
  one small set of runs made together) wrote, and a README.md with the command that made them. Everything below a
  run folder, subfolders included (``results/qa/state-gate/prompt-keys/``), belongs to that run;
- ``results/README.md`` lists the topics and links each topic README; README.md links ``results/README.md``.

The docs are README.md and docs/*.md. The READMEs under results/ are not docs for citing: a run folder counts as
cited only when README.md or a page of docs/ names it, or a path inside it. A doc names a results path either as a
markdown link (resolved against the doc's own folder) or as text (``results/...``, read from the repository root).
A run that no longer exists is cited by the commit that holds it: "run at commit abc1234, `results/foo/` there";
such a path must exist at that commit, not in the tree.

The test fails when a run folder has no README.md or one that names no command (``dynvocab ...``, ``python ...``,
``bash ...``, ``make ...``), when no doc cites a run folder, when a doc names a results path
that does not exist (docs/changelog.md is exempt: it records paths as they were when each change was made), when a
topic folder breaks the shape above, or when a relative link in a README under results/ points at nothing. Plain
text and git only: no network, no model.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
HISTORICAL = {"changelog.md"}  # pages that record paths as they were; read for citations, not held to the tree

# `results/...` as text: stops at whitespace, quotes, brackets, pipes, commas and placeholders (<run>)
PATH = re.compile(r"(?<![\w./-])(?:\.\./)*(results/[^\s`'\"()\[\]<>|,;*{}#]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
AT_COMMIT = re.compile(r"commit ([0-9a-f]{7,40})(?:,| \()\s*`(results/[^`]*)` there")
# a command a run README names
COMMAND = re.compile(r"dynvocab [a-z]|python[0-9.]* |bash |make [a-z]|\.sh\b|accelerate launch")

pytestmark = pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ here (not a checkout)")


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def topic_folders() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_dir())


def run_folders() -> list[Path]:
    return sorted(run for topic in topic_folders() for run in topic.iterdir() if run.is_dir())


def clean(path: str) -> str:
    return path.rstrip(".:")


def named_paths(doc: Path) -> tuple[set[Path], list[tuple[str, str]]]:
    """(the results paths a doc names, resolved; the (commit, path) pairs it names at a commit)."""
    text = doc.read_text(encoding="utf-8")
    at_commit = AT_COMMIT.findall(text)
    text = AT_COMMIT.sub("", text)
    named = set()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        if path == RESULTS or RESULTS in path.parents:
            named.add(path)
    for path in PATH.findall(LINK.sub("", text)):
        named.add((ROOT / clean(path)).resolve())
    return named, at_commit


def test_the_docs_name_only_results_paths_that_exist():
    missing = []
    for doc in docs():
        if doc.name in HISTORICAL:
            continue
        missing += [f"{doc.relative_to(ROOT)}: {p.relative_to(ROOT)}" for p in named_paths(doc)[0] if not p.exists()]
    assert not missing, "docs name results paths that do not exist (moved? deleted? name the commit):\n" + "\n".join(
        sorted(missing))


def test_runs_cited_at_a_commit_exist_at_that_commit():
    cited = sorted({pair for doc in docs() for pair in named_paths(doc)[1]})
    if not cited or not shutil.which("git") or not (ROOT / ".git").exists():
        pytest.skip("no git checkout to look into")
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone holds no older commits")
    query = "".join(f"{commit}:{path.rstrip('/')}\n" for commit, path in cited)
    done = subprocess.run(["git", "cat-file", "--batch-check"], cwd=ROOT, input=query, capture_output=True,
                          text=True, timeout=60)
    missing = [line for line in done.stdout.splitlines() if line.endswith(" missing")]
    assert done.returncode == 0 and not missing, f"not at the commit named: {missing}"


def test_every_run_folder_has_a_readme_with_its_command():
    without = [run.relative_to(ROOT).as_posix() for run in run_folders() if not (run / "README.md").is_file()]
    assert not without, f"run folders without a README.md (what made them, and how): {without}"
    no_command = [run.relative_to(ROOT).as_posix() for run in run_folders()
                  if not COMMAND.search((run / "README.md").read_text(encoding="utf-8"))]
    assert not no_command, f"run READMEs that name no command (dynvocab, python, bash, make ...): {no_command}"


def test_every_run_folder_is_cited_by_a_doc():
    cited = set()
    for doc in docs():
        cited |= named_paths(doc)[0]
    uncited = [run.relative_to(ROOT).as_posix() for run in run_folders()
               if not any(path == run or run in path.parents for path in cited)]
    assert not uncited, f"run folders no doc cites (cite them in README.md or docs/, or delete them): {uncited}"


def test_results_is_topics_of_runs_and_each_topic_says_what_is_current():
    assert (RESULTS / "README.md").is_file() and "(results/README.md)" in (ROOT / "README.md").read_text(
        encoding="utf-8"), "README.md should link results/README.md, the list of topics"
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    stray = [p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md"]
    assert not stray, f"files directly in results/ (put them in a run folder): {stray}"
    assert len(topic_folders()) < 30, "results/ should stay a short list of topics"
    for topic in topic_folders():
        readme = topic / "README.md"
        assert readme.is_file(), f"{topic.relative_to(ROOT)} has no README.md"
        assert f"({topic.name}/README.md)" in index, f"results/README.md does not link {topic.name}/README.md"
        files = [p.name for p in topic.iterdir() if p.is_file() and p.name != "README.md"]
        assert not files, f"{topic.relative_to(ROOT)} holds files outside a run folder: {files}"
        text = readme.read_text(encoding="utf-8")
        unlinked = [run.name for run in topic.iterdir() if run.is_dir() and f"({run.name}/" not in text]
        assert not unlinked, f"{readme.relative_to(ROOT)} does not link its runs {unlinked}"


def test_links_in_the_readmes_under_results_resolve():
    broken = []
    for readme in sorted(RESULTS.rglob("README.md")):
        for target in LINK.findall(readme.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (readme.parent / target.split("#")[0]).exists():
                broken.append(f"{readme.relative_to(ROOT)}: {target}")
    assert not broken, "links that point at nothing:\n" + "\n".join(broken)
