"""Loading document encoders by name or offline alias, and the cached index of an embedded corpus."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from dynvocab.data.assets import DEFAULT_RETRIEVER, HUB_NAMES, resolve_model, wikipedia_leads
from dynvocab.data.corpora import corpus_split
from dynvocab.hardware.precision import encode_autocast_dtype
from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
from encoders import DenseEncoder
from encoders.low_rank import adapter_base, is_adapter, load_merged

from .index.dense import DocumentIndex

__all__ = ["DEFAULT_RETRIEVER", "demo_index", "document_encoder", "is_hybrid_encoder", "leads_index", "load_stack"]

#: Hub names with an offline copy: an adapter made for one loads on the copy when it is installed
OFFLINE_COPIES = {hub: alias for alias, hub in HUB_NAMES.items()}


def document_encoder(name: str = DEFAULT_RETRIEVER, device: str | torch.device | None = None, **settings) -> DenseEncoder:
    """A dense document encoder by name, offline alias (``"minilm-wikipedia"``, ``"minilm"``) or folder, under bf16
    autocast where the device computes bf16 natively (4-5x faster there, vectors within cosine 0.9999 of fp32) and in
    float32 elsewhere, where an emulated bf16 runs 5.7x slower (``dynvocab.hardware.precision``). A LoRA adapter folder
    (``dynvocab extract-adapter``) is merged into the encoder it was made for. ``settings`` go to ``DenseEncoder``
    (``max_length``, ``pooling``). ``device``: the process's own under ``accelerate launch``; default: CUDA if any."""
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    resolved = resolve_model(name)
    model, tokenizer = resolved, None
    if is_adapter(resolved):
        base = _adapter_base_path(resolved)
        model = load_merged(AutoModel.from_pretrained(base), resolved)
        model.name_or_path = name
        tokenizer = AutoTokenizer.from_pretrained(base)
    return DenseEncoder(model, tokenizer=tokenizer, device=device, amp_dtype=encode_autocast_dtype("auto", device),
                        **settings)


def _adapter_base_path(folder: str) -> str:
    """Where the adapter's base loads from: its offline copy when one is installed, else its own name."""
    base = adapter_base(folder)
    if base in OFFLINE_COPIES:
        try:
            return resolve_model(OFFLINE_COPIES[base])
        except FileNotFoundError:  # the offline asset is not installed: the Hub has it
            return base
    return resolve_model(base)


def is_hybrid_encoder(name_or_path: str) -> bool:
    """A folder written by ``HybridEncoder.save_pretrained`` (``dynvocab finetune-encoder --encoder hybrid``)."""
    from encoders.hybrid import CONFIG_FILE

    return (Path(name_or_path) / CONFIG_FILE).is_file()


def demo_index(workdir: Path, corpus: str = "wikipedia", encoder: str = DEFAULT_RETRIEVER):
    """``encoder`` + FAISS index of a corpus's training documents, built once and cached."""
    return _cached_index(workdir / f"{corpus}-index{_folder_suffix(encoder)}", corpus_split(corpus)[0], corpus, encoder)


def leads_index(workdir: Path, encoder: str = DEFAULT_RETRIEVER):
    """``encoder`` + FAISS index of every offline Wikipedia lead, built once and cached in ``workdir``.

    Question answering trains nothing, so it searches all 10,033 leads: the demo's index holds only
    the training part, which lacks 107 of FanOutQA's 558 evidence pages.
    """
    return _cached_index(workdir / f"wikipedia-all-index{_folder_suffix(encoder)}", wikipedia_leads(),
                         "wikipedia (all leads)", encoder)


def _folder_suffix(encoder: str) -> str:
    """Each encoder caches its own index; MiniLM's keeps the folder it had before the default changed."""
    return "" if encoder == "minilm" else "-" + re.sub(r"[^A-Za-z0-9]+", "-", str(encoder)).strip("-")


def _cached_index(path: Path, documents: list[dict], corpus: str, name: str):
    encoder = document_encoder(name)
    if (path / "metadata.json").exists():
        try:
            index = DocumentIndex.load(path, encoder=encoder)
        except ValueError as error:  # its files are damaged, or another encoder built it
            print(f"The cached index in {path} cannot serve {encoder.name!r} ({error}): rebuilding it.")
        else:
            if len(index) == len(documents):
                return index
            print(f"The cached index in {path} has {len(index)} documents, not {len(documents)}: rebuilding it.")
    print(f"Indexing {len(documents)} {corpus} documents with {encoder.name} (once; cached in {path}).")
    index = DocumentIndex.build(documents, encoder, show_progress_bar=True)
    index.save(path)
    return index


def load_stack(model: str, checkpoint: str | None, index_dir: str, encoder: str):
    """Model and document index for ``dynvocab generate``; the index is loaded first, so a wrong path fails fast."""
    if checkpoint is None and model == "smollm2" and SHIPPED_ENCODER.exists():
        checkpoint = SHIPPED_ENCODER
    if is_hybrid_encoder(encoder):
        from encoders.hybrid import HybridEncoder

        from .index.hybrid import HybridIndex
        from .index.hybrid_storage import saved_representation

        hybrid = HybridEncoder.from_pretrained(encoder, representation=saved_representation(Path(index_dir)))
        index = HybridIndex.load(index_dir, encoder=hybrid)
        return load_dynamic_lm(model, checkpoint), index
    documents = document_encoder(encoder)
    index = DocumentIndex.load(index_dir, encoder=documents)
    return load_dynamic_lm(model, checkpoint), index
