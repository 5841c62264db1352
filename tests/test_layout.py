"""The layout is a map of the design: docs/layout.md and docs/architecture.md cannot drift from the tree."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dynvocab", "encoders", "retrieval", "evals")


def layout_section() -> str:
    """docs/layout.md, the one-line-per-module map the README's Layout section links to."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## Layout\n(.*?)^## ", readme, re.S | re.M)
    assert match and "(docs/layout.md)" in match.group(1), "README.md needs a Layout section linking docs/layout.md"
    return (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")


def named_paths() -> list[str]:
    """Every backtick-quoted path on docs/layout.md's ``- `path` — ...`` lines, before the dash."""
    paths = []
    for line in layout_section().splitlines():
        if line.startswith("- `"):
            paths += re.findall(r"`([^`]+)`", line.split(" — ")[0])
    return paths


def package_dirs() -> list[Path]:
    return sorted(p.parent for name in PACKAGES for p in (ROOT / name).rglob("__init__.py"))


def test_every_path_the_layout_names_exists():
    missing = [path for path in named_paths() if not (ROOT / path).exists()]
    assert not missing, f"docs/layout.md names paths that do not exist: {missing}"


def test_the_layout_names_every_package_and_module():
    named = set(named_paths())
    packages = [f"{d.relative_to(ROOT).as_posix()}/" for d in package_dirs()]
    modules = [p.relative_to(ROOT).as_posix() for d in package_dirs() for p in d.glob("*.py")]
    left_out = [path for path in packages + modules if path not in named]
    assert not left_out, f"docs/layout.md leaves out: {left_out} (add a '- `path` — what it is' line)"


@pytest.mark.parametrize("folder", package_dirs(), ids=lambda d: d.relative_to(ROOT).as_posix())
def test_no_module_name_repeats_its_folder_as_a_prefix(folder):
    prefixed = [p.name for p in folder.glob("*.py") if p.stem.startswith(f"{folder.name}_")]
    assert not prefixed, f"{folder.relative_to(ROOT)} holds {prefixed}: the folder already says it"


def test_the_architecture_picture_is_drawn_from_the_current_code():
    done = subprocess.run([sys.executable, "experiments/draw_architecture.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
