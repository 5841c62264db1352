"""The encoders package's bad-input catalogue: loading, settings, encode arguments and pooling."""

import copy

import pytest
import torch

from encoders.dense import DenseEncoder, DenseEncoderConfig, pool


@pytest.fixture
def encoder(tiny_bert, tiny_tokenizer):
    return DenseEncoder(tiny_bert, tokenizer=tiny_tokenizer)


CASES = [
    ("a missing relative path", lambda e: DenseEncoder("./no/such/encoder"), FileNotFoundError, "does not exist"),
    ("a missing absolute path", lambda e: DenseEncoder("/no/such/encoder"), FileNotFoundError, "does not exist"),
    ("an int as model", lambda e: DenseEncoder(5), TypeError, "str or a PreTrainedModel"),
    ("an unknown pooling", lambda e: DenseEncoder(e.model, tokenizer=e.tokenizer, pooling="max"), ValueError,
     "'mean' or 'cls'"),
    ("a max_length of 0", lambda e: DenseEncoder(e.model, tokenizer=e.tokenizer, max_length=0), ValueError,
     "positive int"),
    ("an unknown autocast dtype", lambda e: DenseEncoder(e.model, tokenizer=e.tokenizer, amp_dtype="int8"), ValueError,
     "amp_dtype"),
    ("a config with max_length as a string", lambda e: DenseEncoderConfig(max_length="256"), ValueError, "positive int"),
    ("encode a batch size of 0", lambda e: e.encode(["a"], batch_size=0), ValueError, "batch_size=0"),
    ("encode ints", lambda e: e.encode([1, 2]), TypeError, "texts[0] is int"),
    ("encode a text that tokenizes to nothing", lambda e: _no_specials(e).encode(["the cat", ""]), ValueError,
     "tokenizes to no token"),
    ("encode None in the list", lambda e: e.encode(["a", None]), TypeError, "texts[1] is NoneType"),
    ("pool an unknown kind", lambda e: pool(torch.zeros(1, 2, 3), torch.ones(1, 2), "max2"), ValueError,
     "'mean' or 'cls'"),
    ("pool a mask of another shape", lambda e: pool(torch.zeros(1, 2, 3), torch.ones(1, 5)), ValueError,
     "attention_mask has shape"),
]


@pytest.mark.parametrize(("call", "error", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_a_clear_error(encoder, call, error, fragment):
    with pytest.raises(error) as raised:
        call(encoder)
    assert fragment in str(raised.value)


def _no_specials(encoder):
    """The encoder with a tokenizer that adds no [CLS]/[SEP], so an empty text has no token at all."""
    encoder.tokenizer = copy.deepcopy(encoder.tokenizer)
    encoder.tokenizer._tokenizer.post_processor = None
    return encoder
