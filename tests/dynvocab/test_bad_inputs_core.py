"""The core's bad-input catalogue: each row is a call a user may make, the error type it must raise and a
fragment of the message that names the problem or the fix. No row may pass silently or raise an IndexError,
AttributeError or a bare RuntimeError."""

import copy
import json

import pytest
import torch

from dynvocab import DynamicVocabLM, Phrase
from dynvocab.config import DynamicVocabConfig
from dynvocab.data.assets import resolve_model
from dynvocab.io.jsonl import iter_jsonl
from dynvocab.phrases.table import PhraseTable
from tests.helpers import tiny_llama

PHRASES = ["New York City", "the United States"]


@pytest.fixture
def model(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases(PHRASES)
    return model


def prompt(model, rows=1):
    return torch.tensor([model.tokenizer.encode("He went to the")] * rows)


def per_row(model):
    model.set_phrases([["New York City"], ["big red dog"]])
    return model


CASES = [
    # ---- phrase set changes
    ("set_phrases a bare string", lambda m: m.set_phrases("New York City"), TypeError, "pass ['New York City']"),
    ("set_phrases None", lambda m: m.set_phrases(None), TypeError, "must be a list of phrases"),
    ("set_phrases an int", lambda m: m.set_phrases(7), TypeError, "must be a list of phrases"),
    ("set_phrases ints in the list", lambda m: m.set_phrases([1, 2]), TypeError, "must be a str or dynvocab.Phrase"),
    ("set_phrases phrases and lists mixed", lambda m: m.set_phrases([["New York City"], "big red dog"]), TypeError,
     "not a mix"),
    ("set_phrases three levels deep", lambda m: m.set_phrases([[["New York City"]]]), TypeError, "got list"),
    ("set_phrases a row that is a string", lambda m: m.set_phrases([["New York City"], "x"]), TypeError, "not a mix"),
    ("set_phrases whitespace only", lambda m: m.set_phrases(["   "]), ValueError, "whitespace"),
    ("set_phrases empty string", lambda m: m.set_phrases([""]), ValueError, "empty"),
    ("set_phrases zero-width spaces only", lambda m: m.set_phrases(["\u200b\u200b\u200b"]), ValueError, "invisible"),
    ("set_phrases a byte-order mark and a tab", lambda m: m.set_phrases(["\ufeff\t"]), ValueError, "invisible"),
    ("set_phrases a single token", lambda m: m.set_phrases(["the"]), ValueError, "at least 2 tokens"),
    ("set_phrases too many tokens", lambda m: m.set_phrases(["a b c d e f g h i j k l"]), ValueError, "max_phrase_tokens"),
    ("Phrase with non-str text", lambda m: m.set_phrases([Phrase(5)]), TypeError, "Phrase.text must be a str"),
    ("Phrase with an int source", lambda m: m.set_phrases([Phrase("New York City", source=3)]), TypeError,
     "Phrase.source"),
    ("add_phrases a bare string", lambda m: m.add_phrases("big red dog"), TypeError, "pass ['big red dog']"),
    ("add_phrases a Phrase alone", lambda m: m.add_phrases(Phrase("big red dog")), TypeError, "single phrase"),
    ("add_phrases bytes", lambda m: m.add_phrases([b"big red dog"]), TypeError, "got bytes"),
    ("set_phrases bytes", lambda m: m.set_phrases(b" New York City"), TypeError, "decode the bytes"),
    ("set_phrases a lone surrogate", lambda m: m.set_phrases(["New \ud800 York"]), ValueError, "not valid Unicode"),
    ("set_phrases a special token inside", lambda m: m.set_phrases(["<|endoftext|> The end"]), ValueError,
     "special token '<|endoftext|>'"),
    ("remove_phrases a bare string", lambda m: m.remove_phrases("New York City"), TypeError, "pass ['New York City']"),
    ("remove_phrases an int", lambda m: m.remove_phrases(5), TypeError, "must be a list of phrases"),
    ("remove_phrases None", lambda m: m.remove_phrases(None), TypeError, "must be a list of phrases"),
    # ---- text doors
    ("tokenize an int", lambda m: m.tokenize(5), TypeError, "tokenize takes a str"),
    ("tokenize a list of texts", lambda m: m.tokenize(["a", "b"]), TypeError, "one text at a time"),
    ("tokenize a row past the per-row sets", lambda m: per_row(m).tokenize("x", row=5), ValueError, "pass 0..1"),
    ("tokenize a row without per-row sets", lambda m: m.tokenize("x", row=3), ValueError, "pass 0..0"),
    ("tokenize a negative row", lambda m: per_row(m).tokenize("x", row=-1), ValueError, "not a row"),
    ("decode an id past the table", lambda m: m.decode([10**9]), ValueError, "past the vocabulary"),
    ("decode a negative id", lambda m: m.decode([-5]), ValueError, "negative"),
    ("decode a 2-D tensor", lambda m: m.decode(torch.zeros(2, 2, dtype=torch.long)), ValueError, "pass ids[row]"),
    ("decode a string", lambda m: m.decode("abc"), TypeError, "decode ids, not text"),
    ("decode None", lambda m: m.decode(None), TypeError, "ids must be a sequence of ints"),
    ("decode a float tensor", lambda m: m.decode(torch.tensor([1.5])), TypeError, "integer tensor"),
    ("decode floats in a list", lambda m: m.decode([1.5, 2.0]), TypeError, "sequence of ints"),
    ("segments an id past the table", lambda m: m.segments([10**9]), ValueError, "past the vocabulary"),
    ("segments a negative id", lambda m: m.segments([3, -1]), ValueError, "negative"),
    # ---- forward and generate
    ("forward an id past the table", lambda m: m(torch.tensor([[10**6]])), ValueError, "past the vocabulary"),
    ("forward a negative id", lambda m: m(torch.tensor([[-3]])), ValueError, "negative"),
    ("forward more rows than per-row sets", lambda m: per_row(m)(prompt(m, 4)), ValueError, "one phrase list per row"),
    ("forward a phrase mask of the wrong width", lambda m: m(prompt(m), phrase_mask=torch.ones(1, 7, dtype=torch.bool)),
     ValueError, "bool tensor"),
    ("forward a float phrase mask", lambda m: m(prompt(m), phrase_mask=torch.ones(1, 4)), TypeError, "mask.bool()"),
    ("forward a list as phrase mask", lambda m: m(prompt(m), phrase_mask=[[True] * 4]), TypeError, "bool tensor"),
    ("generate a phrase mask of the wrong shape",
     lambda m: m.generate(prompt(m), max_new_tokens=2, phrase_mask=torch.ones(3, 2, dtype=torch.bool)), ValueError,
     "phrase_mask has shape"),
    ("generate more prompts than phrase lists",
     lambda m: (m.set_phrases([["New York City"]]), m.generate(prompt(m, 2), max_new_tokens=2)), ValueError,
     "one list per prompt"),
    ("generate no_repeat_ngram_size < 0", lambda m: m.generate(prompt(m), max_new_tokens=2, no_repeat_ngram_size=-1),
     ValueError, "positive int"),
    ("generate an unknown no_repeat_ngram_scope",
     lambda m: m.generate(prompt(m), max_new_tokens=2, no_repeat_ngram_size=2, no_repeat_ngram_scope="answer"), ValueError,
     "choose 'all'"),
    ("generate repetition_penalty 0", lambda m: m.generate(prompt(m), max_new_tokens=2, repetition_penalty=0.0),
     ValueError, "> 0"),
    ("generate phrase_agreement_top_k < 0", lambda m: m.generate(prompt(m), max_new_tokens=2, phrase_agreement_top_k=-2),
     ValueError, "positive int"),
    ("generate an empty prompt", lambda m: m.generate(torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2), ValueError,
     "at least one token"),
    ("generate a prompt id one past the table",
     lambda m: m.generate(torch.tensor([[5, m.vocab_size + len(m.phrase_table)]]), max_new_tokens=2), ValueError,
     "outside the vocabulary"),
    ("generate a prompt id 10**6 past the table", lambda m: m.generate(torch.tensor([[5, 10**6 + m.vocab_size]]),
                                                                     max_new_tokens=2), ValueError, "outside the vocabulary"),
    ("generate a negative prompt id", lambda m: m.generate(torch.tensor([[5, -1]]), max_new_tokens=2), ValueError,
     "outside the vocabulary"),
    ("generate float prompt ids", lambda m: m.generate(prompt(m).float(), max_new_tokens=2), TypeError, "ids.long()"),
    ("generate a 1-D prompt", lambda m: m.generate(prompt(m)[0], max_new_tokens=2), ValueError, "ids[None]"),
    ("generate inputs_embeds under token read-back",
     lambda m: m.generate(inputs_embeds=torch.zeros(1, 2, 16), max_new_tokens=2), ValueError, "needs input_ids"),
    # ---- construction and configs
    ("from_causal_lm a missing local path", lambda m: DynamicVocabLM.from_causal_lm("./no/such/model"),
     FileNotFoundError, "does not exist"),
    ("from_causal_lm an int", lambda m: DynamicVocabLM.from_causal_lm(5), TypeError, "Hub name or a path"),
    ("from_causal_lm a model without tokenizer", lambda m: DynamicVocabLM.from_causal_lm(m.lm), ValueError,
     "tokenizer is required"),
    ("from_causal_lm an unknown setting", lambda m: DynamicVocabLM.from_causal_lm(m.lm, m.tokenizer, nonsense=3),
     TypeError, "unknown settings ['nonsense']"),
    ("config readback unknown", lambda m: DynamicVocabConfig(readback="bytes"), ValueError, "'tokens' or 'vector'"),
    ("config encoder_layers 0", lambda m: DynamicVocabConfig(encoder_layers=0), ValueError, ">= 1"),
    ("config encoder_layers a string", lambda m: DynamicVocabConfig(encoder_layers="2"), TypeError, "must be int"),
    ("config max_phrase_tokens 1", lambda m: DynamicVocabConfig(max_phrase_tokens=1), ValueError, "between 2 and 64"),
    ("config phrase_score_scale 0", lambda m: DynamicVocabConfig(phrase_score_scale=0.0), ValueError, "> 0"),
    ("config phrase_score_bias a string", lambda m: DynamicVocabConfig(phrase_score_bias="-1"), TypeError,
     "must be float"),
    ("config phrase_dtype unknown", lambda m: DynamicVocabConfig(phrase_dtype="int8"), ValueError, "phrase_dtype"),
    ("config encode_dtype unknown", lambda m: DynamicVocabConfig(encode_dtype="fp8"), ValueError, "encode_dtype"),
    ("config encode_batch_size True", lambda m: DynamicVocabConfig(encode_batch_size=True), TypeError, "must be int"),
    ("resolve_model a missing absolute path", lambda m: resolve_model("/no/such/model"), FileNotFoundError,
     "does not exist"),
    ("resolve_model None", lambda m: resolve_model(None), TypeError, "Hub name or a path"),
    # ---- save and load
    ("save_pretrained onto a file", lambda m: m.save_pretrained(_a_file()), ValueError, "not a directory"),
    ("save_pretrained an unknown keyword", lambda m: m.save_pretrained(_a_dir(), safe_serialization=True), TypeError,
     "unknown arguments"),
    ("from_pretrained a missing folder", lambda m: DynamicVocabLM.from_pretrained("/no/such/dir", m.lm, m.tokenizer),
     FileNotFoundError, "does not exist"),
    ("from_pretrained a None base model", lambda m: DynamicVocabLM.from_pretrained(_a_dir(), None, m.tokenizer),
     TypeError, "base_model must be the causal LM"),
    ("from_pretrained a None tokenizer", lambda m: DynamicVocabLM.from_pretrained(_a_dir(), m.lm, None), TypeError,
     "tokenizer must be the LM's own"),
    ("from_pretrained an unknown keyword",
     lambda m: DynamicVocabLM.from_pretrained(_a_dir(), m.lm, m.tokenizer, device_map="auto"), TypeError,
     "unknown arguments"),
]


_tmp = {}


def _a_file():
    path = _tmp["root"] / "a-file"
    path.write_text("x")
    return path


def _a_dir():
    return _tmp["root"] / "a-dir"


@pytest.mark.parametrize(("call", "error", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_a_clear_error(model, tmp_path, call, error, fragment):
    _tmp["root"] = tmp_path
    with pytest.raises(error) as raised:
        call(model)
    assert fragment in str(raised.value)


# ---- files read from disk: each corruption is named, never loaded as if it were fine

def _saved(model, tmp_path, save_phrases=True):
    model.save_pretrained(tmp_path / "saved", save_phrases=save_phrases)
    return tmp_path / "saved"


def _flip_tail(path):
    data = bytearray(path.read_bytes())
    data[-8:] = b"\xff" * 8
    path.write_bytes(bytes(data))


DISK_CASES = [
    ("encoder weights with overwritten tail bytes", lambda d: _flip_tail(d / "phrase_encoder.safetensors"), ValueError,
     "does not match the size and sha256"),
    ("config edited into invalid JSON", lambda d: (d / "dynvocab_config.json").write_text("{oops"), ValueError,
     "does not match"),
    ("phrases file edited (two phrases swapped)",
     lambda d: (d / "phrases.jsonl").write_text("".join(reversed((d / "phrases.jsonl").read_text().splitlines(True)))),
     ValueError, "does not match"),
    ("manifest deleted (an interrupted save)", lambda d: (d / "dynvocab_manifest.json").unlink(), ValueError,
     "not a complete dynvocab save"),
    ("manifest truncated", lambda d: (d / "dynvocab_manifest.json").write_text('{"format": "dynv'), ValueError,
     "corrupted"),
    ("encoder weights deleted", lambda d: (d / "phrase_encoder.safetensors").unlink(), FileNotFoundError, "is missing"),
    ("config edited by hand", lambda d: _edit_config(d, phrase_score_bias=-1.5), ValueError, "load with verify=False"),
]


def _edit_config(directory, **values):
    path = directory / "dynvocab_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | values))


#: loads onto another LM than the one the encoder was trained for: (name, edit of the save, verify, fragment)
OTHER_LM_CASES = [
    ("onto an LM of another hidden size", lambda d: None, True, "hidden size 32 (saved for 16)"),
    ("config without its base_* keys, verify=False, onto an LM of another hidden size",
     lambda d: _drop_config_keys(d, "base_hidden_size", "base_vocab_size", "base_model_type", "tokenizer_fingerprint"),
     False, "trained for an LM of hidden size 16, and the base model has hidden size 32"),
]


def _drop_config_keys(directory, *keys):
    path = directory / "dynvocab_config.json"
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k not in keys}))


@pytest.mark.parametrize(("edit", "verify", "fragment"), [c[1:] for c in OTHER_LM_CASES], ids=[c[0] for c in OTHER_LM_CASES])
def test_a_save_loaded_onto_another_lm_names_the_sizes(model, tokenizer, tmp_path, edit, verify, fragment):
    directory = _saved(model, tmp_path)
    edit(directory)
    wider = tiny_llama(len(tokenizer), hidden_size=32)
    with pytest.raises(ValueError) as raised:
        DynamicVocabLM.from_pretrained(directory, wider, tokenizer, verify=verify)
    assert fragment in str(raised.value) and "size mismatch" not in str(raised.value)


@pytest.mark.parametrize(("corrupt", "error", "fragment"), [c[1:] for c in DISK_CASES], ids=[c[0] for c in DISK_CASES])
def test_a_corrupted_save_is_named_not_loaded(model, llama, tokenizer, tmp_path, corrupt, error, fragment):
    directory = _saved(model, tmp_path)
    corrupt(directory)
    with pytest.raises(error, match=None) as raised:
        DynamicVocabLM.from_pretrained(directory, copy.deepcopy(llama), tokenizer)
    assert fragment in str(raised.value)


def test_vectors_saved_for_other_phrases_are_refused_even_with_a_matching_manifest(model, llama, tokenizer, tmp_path):
    directory = _saved(model, tmp_path)
    lines = (directory / "phrases.jsonl").read_text().splitlines(True)
    (directory / "phrases.jsonl").write_text("".join(reversed(lines)))
    (directory / "dynvocab_manifest.json").unlink()
    from dynvocab.io.atomic import _relative_files, _write_manifest  # re-seal the edit, as a careless tool would

    _write_manifest(directory, [f for f in _relative_files(directory)])
    with pytest.raises(ValueError, match="another phrase list"):
        DynamicVocabLM.from_pretrained(directory, copy.deepcopy(llama), tokenizer)


def test_nan_phrase_vectors_are_refused_on_save(model, tmp_path):
    model.phrase_table.output_vectors[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        model.save_pretrained(tmp_path / "nan", save_phrases=True)
    assert not (tmp_path / "nan").exists()


def test_a_config_with_a_wrongly_typed_field_names_file_and_field(tmp_path):
    DynamicVocabConfig().save(tmp_path)
    values = json.loads((tmp_path / "dynvocab_config.json").read_text())
    (tmp_path / "dynvocab_config.json").write_text(json.dumps(values | {"max_phrase_tokens": "8"}))
    with pytest.raises(ValueError, match=r"dynvocab_config.json: DynamicVocabConfig.max_phrase_tokens must be int"):
        DynamicVocabConfig.load(tmp_path)
    (tmp_path / "dynvocab_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        DynamicVocabConfig.load(tmp_path)


def test_a_bad_phrases_file_names_its_line(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"text": "New York City"}\n{"source": "x"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2 has no 'text' field"):
        PhraseTable.read(tmp_path / "p.jsonl")
    (tmp_path / "q.jsonl").write_text('{"text": "a b"}\nnot json\n{"text": "c d"}\n')
    with pytest.raises(ValueError, match=r"q.jsonl:2 is not valid JSON"):
        list(iter_jsonl(tmp_path / "q.jsonl"))


def test_an_iterable_of_phrases_is_read_once(model):
    model.set_phrases(p for p in ["big red dog", "New York City"])
    assert {"big red dog", "New York City"} <= {p.text for p in model.phrases}


def test_removing_an_unknown_phrase_warns(model, caplog):
    model.remove_phrases(["never added here"])
    assert "not in the table" in caplog.text
    assert len(model.phrases) == 4


# ---- calls that must work: ids keep their meaning, phrases may change during generate(), numpy ints are ints


class _AtStep(torch.nn.Module):
    """A logits processor that runs ``action`` once, when the sequences reach ``length`` ids."""

    def __init__(self, length, action):
        super().__init__()
        self.length, self.action, self.done = length, action, False

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] >= self.length and not self.done:
            self.done = True
            self.action()
        return scores


class _AllowedPhrasesWin(torch.nn.Module):
    """Every phrase a row may use scores 1e4 (the first such phrase wins greedy decoding); the others -inf."""

    def forward(self, hidden, vectors, mask=None):
        scores = (hidden[..., :1] * 0 + 1e4).expand(*hidden.shape[:-1], vectors.shape[0]).clone()
        return scores if mask is None else scores.masked_fill(~mask[:, None, :], float("-inf"))


def test_removing_a_phrase_during_generate_never_changes_what_was_emitted(model):
    model.scorer = _AllowedPhrasesWin()  # a phrase wins every step: New York City (the first) while it may
    ids = prompt(model)
    first = model.phrase_table.id_of("New York City")
    removal = _AtStep(ids.shape[1] + 1, lambda: model.remove_phrases(["New York City"]))
    out = model.generate(ids, max_new_tokens=4, do_sample=False, logits_processor=[removal])[0, ids.shape[1]:]
    assert removal.done and out[0] == first  # emitted before the removal
    assert first not in out[2:].tolist()  # the step under way when it was removed had scored it; none after
    assert model.segments(out)[0].text == "New York City" and model.decode(out).startswith("New York City")
    assert "New York City" not in {p.text for p in model.phrases}
    model.add_phrases(["big red dog"])  # later changes leave the old ids alone too
    assert model.decode(out).startswith("New York City")
    model.add_phrases(["New York City"])  # added again: the same id comes back
    assert model.phrase_table.id_of("New York City") == first and "New York City" in {p.text for p in model.phrases}


def test_adding_phrases_during_generate_with_per_row_sets_works(model):
    per_row(model)
    ids = prompt(model, 2)
    grow = _AtStep(ids.shape[1] + 1, lambda: model.add_phrases(["the blue ship"]))
    out = model.generate(ids, max_new_tokens=3, do_sample=False, logits_processor=[grow])
    assert grow.done and out.shape == (2, ids.shape[1] + 3)
    masks = model.phrase_table.row_masks()
    assert masks.shape == (2, len(model.phrase_table)) and bool(masks[:, -1].all())


def test_save_pretrained_dot_from_inside_the_folder(model, llama, tokenizer, tmp_path, monkeypatch):
    target = tmp_path / "saved"
    model.save_pretrained(target)
    monkeypatch.chdir(target)
    model.save_pretrained(".", save_phrases=True)
    assert (target / "phrases.jsonl").is_file() and (tmp_path / "saved").samefile(".")
    assert DynamicVocabLM.from_pretrained(".", copy.deepcopy(llama), tokenizer).phrases


def test_a_config_edited_on_purpose_loads_with_verify_false(model, llama, tokenizer, tmp_path, caplog):
    directory = _saved(model, tmp_path)
    _edit_config(directory, phrase_score_bias=-1.5)
    with caplog.at_level("WARNING"):
        loaded = DynamicVocabLM.from_pretrained(directory, copy.deepcopy(llama), tokenizer, verify=False)
    assert loaded.dynvocab_config.phrase_score_bias == -1.5 and "verify=False" in caplog.text
    _flip_tail(directory / "phrase_encoder.safetensors")  # corruption is still refused by the weights' own check
    with pytest.raises(ValueError):
        DynamicVocabLM.from_pretrained(directory, copy.deepcopy(llama), tokenizer, verify=False)


def test_integer_scalars_of_numpy_and_torch_are_ints():
    import numpy as np

    from dynvocab.config import as_int

    assert as_int(np.int64(5), "k", minimum=1) == 5 and as_int(torch.tensor(3), "k") == 3
    with pytest.raises(TypeError, match="not a bool"):
        as_int(True, "k")
    with pytest.raises(TypeError, match="k=2.5 must be a positive int"):
        as_int(2.5, "k", minimum=1)
    with pytest.raises(ValueError, match="k=0 must be a positive int"):
        as_int(np.int32(0), "k", minimum=1)
