"""Linear layers on prepacked oneDNN weights: the same outputs as ``nn.Linear``, torch's own path where it must."""

import copy
import io

import pytest
import torch
from torch import nn

from dynvocab import DynamicVocabLM, pack_linear_layers, unpack_linear_layers
from dynvocab.hardware import packed_linear
from dynvocab.hardware.packed_linear import PackedLinear
from dynvocab.loading import load_lm

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _packed_layer(bias: bool = True) -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(0)
    plain = nn.Linear(24, 40, bias=bias)
    packed = copy.deepcopy(plain)
    pack_linear_layers(packed)
    return plain, packed


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1, 24), (2, 5, 24), (2, 3, 4, 24), (9, 24), (24,)])
def test_packed_layer_computes_what_linear_computes(shape, bias):
    plain, packed = _packed_layer(bias)
    x = torch.randn(shape)
    with torch.inference_mode():
        expected, got = plain(x), packed(x)
    assert type(packed) is PackedLinear and "_packed" in packed.__dict__
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_changed_weight_is_packed_again():
    plain, packed = _packed_layer()
    x = torch.randn(3, 24)
    with torch.no_grad():
        packed(x)
        for layer in (plain, packed):
            layer.weight.mul_(-2.0)
        torch.testing.assert_close(packed(x), plain(x), atol=1e-5, rtol=1e-5)
        packed.weight = nn.Parameter(torch.zeros_like(packed.weight))  # a new tensor altogether
        torch.testing.assert_close(packed(x), packed.bias.expand(3, -1))


def test_a_weight_changed_behind_the_version_counter_is_seen_after_packing_again():
    plain, packed = _packed_layer()
    x = torch.randn(3, 24)
    with torch.no_grad():
        packed(x)
        for layer in (plain, packed):
            layer.weight.data += 1.0  # as peft's merge_adapter does: no version bump
        assert pack_linear_layers(packed) == 1
        torch.testing.assert_close(packed(x), plain(x), atol=1e-5, rtol=1e-5)


def test_autocast_takes_torchs_path():
    plain, packed = _packed_layer()
    x = torch.randn(2, 24)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = packed(x), plain(x)
    assert got.dtype == expected.dtype == torch.bfloat16 and "_packed" not in packed.__dict__
    torch.testing.assert_close(got, expected)


def test_training_takes_torchs_path_with_gradients():
    plain, packed = _packed_layer()
    x = torch.randn(4, 24, requires_grad=True)
    packed(x).sum().backward()
    plain(x.detach()).sum().backward()
    assert "_packed" not in packed.__dict__
    torch.testing.assert_close(packed.weight.grad, plain.weight.grad)
    assert x.grad is not None


NATIVE_BF16 = pytest.param(True, id="native-bf16", marks=pytest.mark.skipif(
    not packed_linear.cpu_bf16(), reason="this CPU has no native bf16: oneDNN refuses to pack a bf16 weight here"))


@pytest.mark.parametrize("native", [NATIVE_BF16, pytest.param(False, id="emulated-bf16")])
def test_bfloat16_is_packed_only_where_the_cpu_computes_it(monkeypatch, native):
    """On a CPU with native bf16 a bfloat16 layer runs packed and computes what ``nn.Linear`` does in bf16; where bf16
    is emulated it takes torch's path (oneDNN's emulated bf16 GEMM is slower than float32). The packed path runs
    only where the CPU has the instructions: oneDNN raises on an AVX2 CPU rather than emulate."""
    monkeypatch.setattr(packed_linear, "cpu_bf16", lambda: native)
    plain, packed = _packed_layer()
    plain, packed = plain.to(torch.bfloat16), packed.to(torch.bfloat16)
    x = torch.randn(3, 5, 24, dtype=torch.bfloat16)
    with torch.inference_mode():
        got, expected = packed(x), plain(x)
    assert got.dtype == torch.bfloat16 and ("_packed" in packed.__dict__) == native
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
    with torch.inference_mode(), pytest.raises(RuntimeError):
        packed(x.float())  # a float32 input to a bf16 layer: torch's own error, as nn.Linear's


def test_other_dtypes_take_torchs_path():
    plain, packed = _packed_layer()
    x = torch.randn(2, 24, dtype=torch.float64)
    with torch.no_grad():
        got = packed.double()(x)
    assert "_packed" not in packed.__dict__
    torch.testing.assert_close(got, plain.double()(x))


def test_packed_layers_save_copy_and_unpack_as_plain_linear_layers():
    plain, packed = _packed_layer()
    with torch.no_grad():
        packed(torch.randn(2, 24))
    assert packed.state_dict().keys() == plain.state_dict().keys()
    copied = copy.deepcopy(packed)
    assert "_packed" not in copied.__dict__
    buffer = io.BytesIO()
    torch.save(packed, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    x = torch.randn(2, 24)
    with torch.no_grad():
        for layer in (copied, loaded):
            torch.testing.assert_close(layer(x), plain(x), atol=1e-5, rtol=1e-5)
    assert unpack_linear_layers(packed) == 1
    assert type(packed) is nn.Linear and "_packed" not in packed.__dict__


def test_a_packed_lm_decodes_as_the_plain_one(llama, tokenizer):
    plain = copy.deepcopy(llama)
    count = pack_linear_layers(llama)
    assert count == sum(type(m) is PackedLinear for m in llama.modules()) > 0
    ids = tokenizer("The history of the city", return_tensors="pt").input_ids
    with torch.inference_mode():
        torch.testing.assert_close(llama(ids).logits, plain(ids).logits, atol=1e-4, rtol=1e-4)
        expected = plain.generate(ids, max_new_tokens=12, do_sample=False)
        got = llama.generate(ids, max_new_tokens=12, do_sample=False)
    assert got.tolist() == expected.tolist()
    assert all("_packed" in m.__dict__ for m in llama.modules() if type(m) is PackedLinear)  # the packed path ran


def test_a_dynamic_model_trains_through_a_packed_lm(llama, tokenizer):
    pack_linear_layers(llama)
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer, encoder_layers=1)
    model.set_phrases(["the history of", "of the city"])
    ids = tokenizer("The history of the city", return_tensors="pt").input_ids
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert any(p.grad is not None for p in model.phrase_encoder.parameters())


def test_without_onednn_nothing_is_packed(llama, monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert pack_linear_layers(llama) == 0
    assert not any(type(m) is PackedLinear for m in llama.modules())


def test_the_librarys_loader_packs_the_lms_linear_layers(tiny_lm_dir):
    lm, _ = load_lm(str(tiny_lm_dir))
    assert any(type(m) is PackedLinear for m in lm.modules())
    assert not any(type(m) is nn.Linear for m in lm.modules())
