"""The scripts that made results/ live in experiments/ and run from the repository root as they are (#37).

Each one answers ``--help`` without loading a model or data, and no script under experiments/ or examples/ edits
the import path: the packages are installed, so ``python experiments/<path>.py`` imports them as any user would.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "experiments").rglob("*.py"))


def test_experiments_exist():
    assert SCRIPTS, "no scripts under experiments/"
    assert not list((ROOT / "results").rglob("*.py")), "results/ holds outputs only; scripts belong in experiments/"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_help_runs_from_the_repository_root(script):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # the installed packages, not the checkout on the path, must be what imports
    done = subprocess.run([sys.executable, str(script.relative_to(ROOT)), "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout


@pytest.mark.parametrize("folder", ["experiments", "examples"])
def test_no_script_edits_the_import_path(folder):
    offenders = [str(path.relative_to(ROOT)) for path in sorted((ROOT / folder).rglob("*.py"))
                 if "sys.path" in path.read_text(encoding="utf-8")]
    assert not offenders, f"these edit sys.path: {offenders}"
