"""One precision policy: every entry point that encodes documents runs bf16 only where the CPU computes it natively.

The capability check is forced both ways; the index build, the pipeline's index loading, eval-retrieval and QA
must all follow it, and no module of the library picks bf16 on its own.
"""

import json
import re
from pathlib import Path

import pytest
import torch

from dynvocab.cli import main
from dynvocab.hardware.precision import encode_autocast, encode_autocast_dtype, native_bf16

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [{"id": f"d{i}", "title": f"Doc {i}", "text": f"the river city {i} has a bank and a tower"} for i in range(6)]


@pytest.fixture(params=[True, False], ids=["native-bf16", "emulated-bf16"])
def native(request, monkeypatch) -> bool:
    """The CPU's bf16 capability, forced."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: request.param)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert native_bf16(torch.device("cpu")) is request.param
    return request.param


@pytest.mark.parametrize("capability, onednn_isa", [("AVX2", None), ("DEFAULT", None), ("AVX512", "AVX2"),
                                                    ("AVX512", "avx512_core")])
def test_a_cpu_held_below_its_bf16_instructions_emulates_bf16(monkeypatch, capability, onednn_isa):
    """A CPU with AVX-512 BF16 whose kernels torch may not use (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA): float32."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    if onednn_isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn_isa)
    assert not native_bf16(torch.device("cpu"))
    assert encode_autocast_dtype("auto", torch.device("cpu")) is None


def expected(native: bool) -> str | None:
    return "bfloat16" if native else None


def test_every_entry_point_that_encodes_follows_the_policy(native, tmp_path, tiny_encoder_dir):
    from evals.qa.protocol import QAEvalConfig, load_index
    from evals.retrieval.config import RetrievalEvalConfig
    from evals.retrieval.quick_protocol import _dense_encoder
    from retrieval.loading import document_encoder

    encoder = str(tiny_encoder_dir)
    assert document_encoder(encoder).config.amp_dtype == expected(native)
    data = tmp_path / "documents.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCUMENTS))
    main(["index", "--data", str(data), "--encoder", encoder, "--output", str(tmp_path / "index")])  # index build
    saved = json.loads((tmp_path / "index" / "metadata.json").read_text())
    assert saved["encoder"]["amp_dtype"] == expected(native)
    qa_index = load_index(QAEvalConfig(index=str(tmp_path / "index"), encoder=encoder))  # QA (and the pipeline's load)
    assert qa_index.encoder.config.amp_dtype == expected(native)
    assert _dense_encoder(encoder, RetrievalEvalConfig()).config.amp_dtype == expected(native)  # eval-retrieval
    with encode_autocast(torch.device("cpu")):  # the DupMAE / hybrid encoders run under this
        assert torch.is_autocast_enabled("cpu") is native


def test_no_module_picks_bf16_on_its_own():
    """bf16 is chosen in dynvocab/hardware/precision.py alone: nowhere else a literal bf16 autocast or amp_dtype."""
    literal = re.compile(r"autocast\([^)]*bfloat16|amp_dtype\s*=\s*['\"]bfloat16")
    offenders = [f"{path.relative_to(ROOT)}:{number}"
                 for folder in ("dynvocab", "encoders", "retrieval", "evals", "experiments", "examples")
                 for path in (ROOT / folder).rglob("*.py")
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if literal.search(line)]
    assert not offenders, f"pick the dtype with dynvocab.hardware.precision.encode_autocast(_dtype) instead: {offenders}"
