"""Save a ``DynamicVocabLM``'s own parts and put them back on a fresh base LM."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from .atomic import atomic_directory
from .config import CONFIG_NAME, DynamicVocabConfig
from .phrase_encoder import PhraseEncoder, unwrap_model
from .phrase_table import PhraseTable

ENCODER_WEIGHTS = "phrase_encoder.safetensors"
ENCODER_CONFIG = "phrase_encoder_config.json"
PHRASES = "phrases.jsonl"
PHRASE_VECTORS = "phrase_vectors.safetensors"

__all__ = ["load", "save", "tokenizer_fingerprint"]


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary, to catch loading onto another tokenizer."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def save(model, directory: str | Path, save_phrases: bool = False) -> None:
    """Write config, encoder body config and encoder weights (and phrases) into ``directory`` atomically."""
    encoder: PhraseEncoder = model.phrase_encoder
    with atomic_directory(directory) as staging:
        model.dynvocab_config.save(staging)
        body = {"config": encoder.body.config.to_dict(), "shares_embeddings": encoder.shares_embeddings}
        (staging / ENCODER_CONFIG).write_text(json.dumps(body, indent=2, default=str) + "\n", encoding="utf-8")
        weights = {k: v.detach().contiguous().cpu() for k, v in encoder.trainable_state_dict().items()}
        save_file(weights, staging / ENCODER_WEIGHTS, metadata={"format": "pt"})
        if save_phrases and len(model.phrase_table):
            model.phrase_table.save(staging / PHRASES)
            vectors = model.phrase_output_vectors()
            save_file({"output": vectors.contiguous().cpu()}, staging / PHRASE_VECTORS)


def load(cls, directory: str | Path, base_model, tokenizer):
    """Rebuild the model saved in ``directory`` on ``base_model`` with ``tokenizer``."""
    directory = Path(directory)
    for name in (CONFIG_NAME, ENCODER_CONFIG, ENCODER_WEIGHTS):
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory / name} is missing: was {directory} written by DynamicVocabLM.save_pretrained?")
    config = DynamicVocabConfig.load(directory)
    base = unwrap_model(base_model)
    _check_base(config, base, tokenizer, tokenizer_fingerprint(tokenizer), directory)
    body = json.loads((directory / ENCODER_CONFIG).read_text(encoding="utf-8"))
    encoder = PhraseEncoder.from_config_dict(
        body["config"], base.config.hidden_size, config.head_hidden_size, body["shares_embeddings"]
    )
    weights = load_file(directory / ENCODER_WEIGHTS)
    result = encoder.load_state_dict(weights, strict=False)
    if result.unexpected_keys or (not body["shares_embeddings"] and result.missing_keys):
        raise ValueError(f"{directory / ENCODER_WEIGHTS} does not match its config: {result}")
    if body["shares_embeddings"]:
        encoder.body.set_input_embeddings(base.get_input_embeddings())
    encoder.to(device=base.device, dtype=base.dtype).attach(base)
    model = cls(base_model, tokenizer, encoder, config)
    if (directory / PHRASES).exists():
        model.phrase_table.add(PhraseTable.read(directory / PHRASES))
        vectors = load_file(directory / PHRASE_VECTORS) if (directory / PHRASE_VECTORS).exists() else None
        if vectors is not None and vectors["output"].shape[0] == len(model.phrase_table):
            model.restore_phrase_output_vectors(vectors["output"].to(base.device))
    return model


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
