"""A fine-tuned document encoder as a LoRA adapter on the encoder it started from (``dynvocab extract-adapter``).

A soup of fine-tuned MiniLMs weighs 90 MB; its difference from MiniLM, cut to rank 32, weighs under 10 MB and gives
vectors within cosine 0.9997 of it, so a trained retriever can ship beside the library and load on top of the
offline MiniLM (:func:`retrieval.loading.document_encoder`). A hybrid (``finetune-encoder --encoder hybrid``)
exports its body as a mean-pooled dense encoder; its projection must be the identity up to ``tolerance``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModel

from dynvocab.data.assets import HUB_NAMES, resolve_model
from dynvocab.io.atomic import atomic_directory
from encoders.hybrid import CONFIG_FILE, PROJECTION_FILE
from encoders.low_rank import low_rank_adapter

__all__ = ["REPORT_FILE", "extract_adapter", "model_card"]

#: written beside the adapter: the source, the base, the rank and the error each adapted weight keeps
REPORT_FILE = "low_rank.json"


def extract_adapter(encoder: str | Path, output: str | Path, base: str = "minilm", rank: int = 32,
                    tolerance: float = 0.01) -> dict:
    """Write ``encoder``'s difference from ``base`` as a rank-``rank`` LoRA adapter into ``output``; returns the
    report (also in ``output/low_rank.json``).

    Args:
        encoder: a fine-tuned encoder folder (``finetune-encoder`` or ``soup-encoders`` output; dense, or hybrid
            with a mean-pooled, near-identity projection).
        base: what it was fine-tuned from (``"minilm"``: the offline asset, recorded by its Hub name).
        rank: the rank kept of each weight's difference.
        tolerance: the largest relative distance ``||P - I|| / ||I||`` of a hybrid's projection from the identity.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank={rank!r} must be a positive int, e.g. 32")
    folder = Path(resolve_model(str(encoder)))
    _check_dense_body(folder, tolerance)
    tuned, loading = AutoModel.from_pretrained(folder, output_loading_info=True)
    start = AutoModel.from_pretrained(resolve_model(base))
    missing = set(loading["missing_keys"])
    if missing:  # a masked-LM folder has no pooler: keep the base's (mean pooling never reads it)
        state = tuned.state_dict()
        state.update({key: value for key, value in start.state_dict().items() if key in missing})
        tuned.load_state_dict(state)
    model, errors = low_rank_adapter(start, tuned, rank)
    model.peft_config["default"].base_model_name_or_path = HUB_NAMES.get(base, base)
    report = {"encoder": str(encoder), "base": HUB_NAMES.get(base, base), "rank": rank, "pooling": "mean",
              "largest_relative_error": max(errors.values(), default=0.0), "relative_errors": errors}
    with atomic_directory(output) as staging:
        model.save_pretrained(staging, save_embedding_layers=False)  # the vocabulary is the base's: keep only B @ A
        (Path(staging) / REPORT_FILE).write_text(json.dumps(report, indent=2), encoding="utf-8")
        (Path(staging) / "README.md").write_text(model_card(report), encoding="utf-8")  # instead of peft's blank card
    return report


def model_card(report: dict) -> str:
    """The adapter folder's README: what it was cut from, and how to load it."""
    return f"""# A document encoder as a LoRA adapter

`{report["encoder"]}` (mean pooling, normalised vectors), written by `dynvocab extract-adapter` as a rank-{report["rank"]}
LoRA adapter on `{report["base"]}`: the truncated SVD of each changed weight's difference, the changed layer norms
and all biases whole. The largest relative error it leaves in a weight is {report["largest_relative_error"]:.2g}
(each weight's in `{REPORT_FILE}`).

In dynvocab, pass this folder as `--encoder` (or `retrieval.loading.document_encoder(folder)`). Elsewhere:

```python
from peft import PeftModel
from transformers import AutoModel

model = PeftModel.from_pretrained(AutoModel.from_pretrained("{report["base"]}"), "<this folder>").merge_and_unload()
```

Pool the last hidden states by their mean over the attention mask and L2-normalise them.
"""


def _check_dense_body(folder: Path, tolerance: float) -> None:
    """Refuse a hybrid whose dense part is not its body's token mean, unprojected."""
    if not (folder / CONFIG_FILE).is_file():
        return
    config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    weight = load_file(folder / PROJECTION_FILE)["weight"]
    identity = torch.eye(*weight.shape)
    distance = float((weight - identity).norm() / identity.norm()) if weight.shape[0] == weight.shape[1] else float("inf")
    if config.get("pooling") != "mean" or distance > tolerance:
        raise ValueError(f"{folder} is a hybrid whose dense part is {config.get('pooling')!r}-pooled and projected "
                         f"({distance:.3g} from the identity; tolerance {tolerance}), so its body alone is not the "
                         "retriever it was trained as; fine-tune it with --dense_pooling mean and --dense_dim equal to "
                         "the hidden size, or raise tolerance if you accept the change")
