"""Save a ``DynamicVocabLM``'s own parts and put them back on a fresh base LM."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .config import CONFIG_NAME, DynamicVocabConfig
from .io.atomic import atomic_directory, recover, verify
from .phrases.encoder import PhraseEncoder, unwrap_model
from .phrases.table import PhraseTable

logger = logging.getLogger(__name__)

ENCODER_WEIGHTS = "phrase_encoder.safetensors"
ENCODER_CONFIG = "phrase_encoder_config.json"
PHRASES = "phrases.jsonl"
PHRASE_VECTORS = "phrase_vectors.safetensors"

__all__ = ["load", "save", "tokenizer_fingerprint", "write_model_files"]


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary, to catch loading onto another tokenizer."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def save(model, directory: str | Path, save_phrases: bool = False) -> None:
    """Write the model's own files into ``directory`` atomically (``dynvocab.io.atomic``), with a manifest last."""
    with atomic_directory(directory) as staging:
        write_model_files(model, staging, save_phrases)


def write_model_files(model, directory: Path, save_phrases: bool = False) -> None:
    """Config, encoder body config and encoder weights (and the phrases with their vectors) into ``directory``."""
    encoder: PhraseEncoder = model.phrase_encoder
    model.dynvocab_config.save(directory)
    body = {"config": encoder.body.config.to_dict(), "shares_embeddings": encoder.shares_embeddings}
    (directory / ENCODER_CONFIG).write_text(json.dumps(body, indent=2, default=str) + "\n", encoding="utf-8")
    weights = {k: v.detach().contiguous().cpu() for k, v in encoder.trainable_state_dict().items()}
    _refuse_non_finite(weights, "the phrase encoder's weights")
    save_file(weights, directory / ENCODER_WEIGHTS, metadata={"format": "pt"})
    live = model.phrase_table.live_indices()  # removed phrases are not saved
    if save_phrases and live:
        model.phrase_table.save(directory / PHRASES)
        vectors = model.phrase_output_vectors()[live].contiguous().cpu()
        _refuse_non_finite({"output": vectors}, "the phrase vectors")
        metadata = {"phrases_sha256": _phrases_digest([model.phrase_table.phrases[i] for i in live])}
        save_file({"output": vectors}, directory / PHRASE_VECTORS, metadata=metadata)


def load(cls, directory: str | Path, base_model, tokenizer, verify_files: bool = True):
    """Rebuild the model saved in ``directory`` on ``base_model`` with ``tokenizer``.

    ``verify_files=False`` loads files edited by hand since the save (their sizes and hashes no longer match the
    manifest), with a warning; a corrupted weights or phrases file is still refused by its own checks.
    """
    if not isinstance(base_model, torch.nn.Module):
        raise TypeError(
            f"base_model must be the causal LM the phrase encoder was trained on (an nn.Module), got "
            f"{type(base_model).__name__}; load it first, e.g. AutoModelForCausalLM.from_pretrained(name)"
        )
    if tokenizer is None or not callable(tokenizer):
        raise TypeError(f"tokenizer must be the LM's own tokenizer, got {type(tokenizer).__name__}; load it with "
                        "AutoTokenizer.from_pretrained(name)")
    directory = Path(directory)
    recover(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} does not exist; pass the folder DynamicVocabLM.save_pretrained wrote")
    for name in (CONFIG_NAME, ENCODER_CONFIG, ENCODER_WEIGHTS):
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory / name} is missing: was {directory} written by DynamicVocabLM.save_pretrained?")
    if verify_files:
        verify(directory)
    else:
        logger.warning("%s: loaded without checking its files against their manifest (verify=False)", directory)
    config = DynamicVocabConfig.load(directory)
    if config.readback_mismatch():
        logger.warning("%s: %s", directory, config.readback_mismatch())
    base = unwrap_model(base_model)
    _check_base(config, base, tokenizer, tokenizer_fingerprint(tokenizer), directory)
    body = json.loads((directory / ENCODER_CONFIG).read_text(encoding="utf-8"))
    weights = load_file(directory / ENCODER_WEIGHTS)
    _refuse_non_finite(weights, str(directory / ENCODER_WEIGHTS))
    _check_output_size(weights, base.config.hidden_size, directory)
    encoder = PhraseEncoder.from_config_dict(
        body["config"], base.config.hidden_size, config.head_hidden_size, body["shares_embeddings"]
    )
    result = encoder.load_state_dict(weights, strict=False)
    if result.unexpected_keys or (not body["shares_embeddings"] and result.missing_keys):
        raise ValueError(f"{directory / ENCODER_WEIGHTS} does not match its config: {result}")
    if body["shares_embeddings"]:
        encoder.body.set_input_embeddings(base.get_input_embeddings())
    encoder.to(device=base.device, dtype=base.dtype).attach(base)
    model = cls(base_model, tokenizer, encoder, config)
    if (directory / PHRASES).exists():
        phrases = PhraseTable.read(directory / PHRASES)
        model.phrase_table.add(phrases)
        if (directory / PHRASE_VECTORS).exists():
            model.restore_phrase_output_vectors(_phrase_vectors(directory, model.phrase_table.phrases).to(base.device))
    return model


def _phrase_vectors(directory: Path, phrases) -> torch.Tensor:
    """The saved output vectors, refused unless they were saved for exactly these phrases, in this order."""
    path = directory / PHRASE_VECTORS
    with safe_open(path, framework="pt") as handle:
        recorded = (handle.metadata() or {}).get("phrases_sha256")
        vectors = handle.get_tensor("output")
    if recorded != _phrases_digest(phrases) or vectors.shape[0] != len(phrases):
        raise ValueError(
            f"{path} holds vectors for another phrase list than {directory / PHRASES} ({vectors.shape[0]} rows for "
            f"{len(phrases)} phrases): the phrases file was edited after saving; delete {PHRASE_VECTORS} to re-encode "
            "the phrases, or save the model again"
        )
    _refuse_non_finite({"output": vectors}, str(path))
    return vectors


def _phrases_digest(phrases) -> str:
    """A hash of the phrase texts in table order: the vectors file records the phrases it belongs to."""
    return hashlib.sha256(json.dumps([p.text for p in phrases], ensure_ascii=False).encode()).hexdigest()


def _refuse_non_finite(tensors: dict[str, torch.Tensor], what: str) -> None:
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(
                f"{what} hold NaN or Inf values (tensor {name!r}); the file is corrupted or the training diverged: "
                "restore a good copy, or retrain from the last good checkpoint"
            )


def _check_output_size(weights: dict[str, torch.Tensor], hidden_size: int, directory: Path) -> None:
    """Refuse an encoder whose head writes vectors for an LM of another hidden size (the config's ``base_*`` keys,
    which say so first, may have been edited away)."""
    last = max((key for key in weights if key.startswith("head.") and key.endswith(".weight")),
               key=lambda key: int(key.split(".")[1]), default=None)
    saved = weights[last].shape[0] // 2 if last is not None else hidden_size  # (input, output) vectors per phrase
    if saved != hidden_size:
        raise ValueError(
            f"{directory / ENCODER_WEIGHTS} was trained for an LM of hidden size {saved}, and the base model has hidden "
            f"size {hidden_size}; load it onto the LM it was trained on (the base_model_type and base_hidden_size of "
            f"{directory / CONFIG_NAME}, if they were not edited away), or train a phrase encoder for this LM"
        )


def _check_base(config: DynamicVocabConfig, base, tokenizer, fingerprint: str, directory: Path) -> None:
    problems = []
    if config.base_hidden_size is not None and config.base_hidden_size != base.config.hidden_size:
        problems.append(f"hidden size {base.config.hidden_size} (saved for {config.base_hidden_size})")
    rows = base.get_input_embeddings().num_embeddings
    if config.base_vocab_size is not None and config.base_vocab_size != rows:
        problems.append(f"vocabulary size {rows} (saved for {config.base_vocab_size})")
    if config.tokenizer_fingerprint is not None and config.tokenizer_fingerprint != fingerprint:
        problems.append("a tokenizer with a different vocabulary")
    if problems:
        raise ValueError(
            f"the base model does not match the one {directory} was trained on: it has {', '.join(problems)}; "
            f"load it onto a {config.base_model_type} model with the same tokenizer"
        )
