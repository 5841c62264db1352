"""DupMAE pre-training (Xiao et al., 2022): a BERT-like encoder learns to put the document into both
its [CLS] vector and its ordinary-token (OT) vectors.

Three losses, each weighted by :class:`DupMAEConfig`:

- ``mlm``: the encoder's masked-language-model loss at ``encoder_mask_ratio`` (30%);
- ``decoder``: a one-layer [CLS] decoder rebuilds the input from the [CLS] vector. Its query stream is
  [CLS] + position embeddings, its context stream [CLS] then token + position embeddings, and each
  query row sees position 0 and a random ``1 - decoder_mask_ratio`` of the other positions, never itself
  (RetroMAE's enhanced decoding, :func:`encoders.masking.decoder_attention_mask`);
- ``bow``: the OT decoder. The MLM head projects the unmasked tokens' states to the vocabulary, the
  projections are max-pooled over positions and soft-maxed, and the loss is the cross-entropy against
  the input's unique tokens (uniform weights).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .masking import IGNORE_INDEX, bag_of_words_targets, decoder_attention_mask, mask_for_mlm, ordinary_tokens

__all__ = ["DECODER_FILE", "DupMAEConfig", "DupMAEForPretraining", "TwoStreamDecoderLayer", "bag_of_words_loss",
           "load_masked_lm", "mlm_head"]

logger = logging.getLogger(__name__)

CONFIG_FILE = "dupmae_config.json"
DECODER_FILE = "dupmae_decoder.safetensors"


@dataclass
class DupMAEConfig:
    """Settings of DupMAE pre-training (the paper's defaults)."""

    encoder_mask_ratio: float = field(default=0.3, metadata={"help": "share of ordinary tokens masked for the encoder MLM"})
    decoder_mask_ratio: float = field(default=0.5, metadata={"help": "share of context positions each decoder row does not see"})
    mlm_weight: float = field(default=1.0, metadata={"help": "weight of the encoder MLM loss"})
    decoder_weight: float = field(default=1.0, metadata={"help": "weight of the [CLS] decoder loss"})
    bow_weight: float = field(default=1.0, metadata={"help": "weight of the OT bag-of-words loss (released code: 0.1)"})

    def __post_init__(self) -> None:
        for name in ("encoder_mask_ratio", "decoder_mask_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
                raise ValueError(f"{name}={value!r} must be a fraction in (0, 1), e.g. 0.3")
        for name in ("mlm_weight", "decoder_weight", "bow_weight"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name}={value!r} must be a number >= 0 (0 switches the loss off)")

    def save(self, directory: str | Path) -> None:
        (Path(directory) / CONFIG_FILE).write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path) -> DupMAEConfig:
        """The config saved in ``directory``; keys from a newer version are warned about and dropped."""
        raw = json.loads((Path(directory) / CONFIG_FILE).read_text(encoding="utf-8"))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            logger.warning("ignoring unknown DupMAE settings %s in %s", unknown, directory)
        return cls(**{k: v for k, v in raw.items() if k in known})


def load_masked_lm(name_or_path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``AutoModelForMaskedLM`` and its tokenizer; a missing local folder says so (not a Hub id error).

    A checkpoint without MLM-head weights (all-MiniLM-L6-v2 is a plain ``BertModel``) gets a fresh head
    whose output layer is tied to the word embeddings, as transformers initialises it.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise TypeError(f"name_or_path={name_or_path!r} must be a Hub name or a local folder (str)")
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_local and not Path(name_or_path).expanduser().is_dir():
        raise ValueError(f"no model folder at {name_or_path!r}; pass an existing folder or a Hub name")
    model = AutoModelForMaskedLM.from_pretrained(name_or_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.mask_token_id is None:
        raise ValueError(f"the tokenizer of {name_or_path!r} has no mask token; DupMAE needs an MLM tokenizer")
    return model, tokenizer


def mlm_head(model: PreTrainedModel) -> nn.Module:
    """The module mapping hidden states ``(..., h)`` to vocabulary logits ``(..., V)`` (BERT ``cls``, RoBERTa ``lm_head``)."""
    for name in ("cls", "lm_head"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Module):
            return head
    raise ValueError(
        f"{type(model).__name__} has no MLM head called 'cls' or 'lm_head'; use a BERT- or RoBERTa-like masked LM"
    )


def bag_of_words_loss(logits: torch.Tensor, pool_mask: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """DupMAE's OT loss: ``logits (b, t, V)`` max-pooled over the positions where ``pool_mask (b, t)`` holds,
    soft-maxed, and scored against ``targets (b, V)`` (rows sum to 1): ``-mean_b sum_v targets * log p``."""
    pooled = logits.masked_fill(~pool_mask[..., None], torch.finfo(logits.dtype).min).amax(dim=1)
    return -(F.log_softmax(pooled.float(), dim=-1) * targets).sum(dim=-1).mean()


class TwoStreamDecoderLayer(nn.Module):
    """One post-norm transformer layer whose queries come from one stream and keys/values from another."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, eps: float = 1e-12) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attention = nn.MultiheadAttention(hidden_size, num_heads, batch_first=True)
        self.attention_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.feed_forward = nn.Sequential(
            nn.Linear(hidden_size, intermediate_size), nn.GELU(), nn.Linear(intermediate_size, hidden_size)
        )
        self.output_norm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, query: torch.Tensor, context: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """``query``, ``context`` ``(b, t, h)``; ``visible (b, t, t)`` bool, True where a row may attend."""
        blocked = (~visible).repeat_interleave(self.num_heads, dim=0)
        attended, _ = self.attention(query, context, context, attn_mask=blocked, need_weights=False)
        hidden = self.attention_norm(query + attended)
        return self.output_norm(hidden + self.feed_forward(hidden))


class DupMAEForPretraining(nn.Module):
    """A masked LM plus the [CLS] decoder; ``forward`` returns the weighted loss and its three terms."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: DupMAEConfig | None = None) -> None:
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.config = config or DupMAEConfig()
        self.head = mlm_head(model)
        embeddings = getattr(model.base_model, "embeddings", None)
        if not isinstance(getattr(embeddings, "position_embeddings", None), nn.Embedding):
            raise ValueError(f"{type(model).__name__} has no learned absolute position embeddings; DupMAE's "
                             "decoder needs them (BERT, RoBERTa, MiniLM and ELECTRA have them)")
        self.embeddings = embeddings
        hf = model.config
        self.decoder = TwoStreamDecoderLayer(hf.hidden_size, hf.num_attention_heads, hf.intermediate_size,
                                             getattr(hf, "layer_norm_eps", 1e-12))
        self.special_ids = sorted(set(tokenizer.all_special_ids))

    @classmethod
    def from_pretrained(cls, name_or_path: str, config: DupMAEConfig | None = None) -> DupMAEForPretraining:
        """Any BERT-like masked LM by Hub name or folder; a folder this class saved brings its decoder back."""
        model, tokenizer = load_masked_lm(name_or_path)
        folder = Path(name_or_path)
        if config is None and (folder / CONFIG_FILE).is_file():
            config = DupMAEConfig.load(folder)
        built = cls(model, tokenizer, config)
        if (folder / DECODER_FILE).is_file():
            built.decoder.load_state_dict(load_file(folder / DECODER_FILE))
        return built

    def save_pretrained(self, directory: str | Path) -> None:
        """Writes the masked LM, its tokenizer, the decoder weights and the config into ``directory``."""
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.decoder.state_dict().items()},
                  Path(directory) / DECODER_FILE)
        self.config.save(directory)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """``input_ids``, ``attention_mask`` ``(b, t)`` unmasked; masks drawn from ``generator``.

        Returns ``{"loss", "mlm", "decoder", "bow"}`` (scalars; ``loss`` is the weighted sum).
        """
        config, vocab = self.config, self.model.config.vocab_size
        ordinary = ordinary_tokens(input_ids, attention_mask, self.special_ids)
        masked, labels = mask_for_mlm(input_ids, ordinary, config.encoder_mask_ratio, self.tokenizer.mask_token_id,
                                      vocab, generator)
        hidden = self.model.base_model(input_ids=masked, attention_mask=attention_mask).last_hidden_state
        logits = self.head(hidden)
        mlm = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        unmasked = ordinary & (labels == IGNORE_INDEX)
        bow = bag_of_words_loss(logits, unmasked, bag_of_words_targets(input_ids, ordinary, vocab))
        decoder = self._decoder_loss(hidden[:, :1], input_ids, attention_mask, ordinary, generator)
        loss = config.mlm_weight * mlm + config.decoder_weight * decoder + config.bow_weight * bow
        return {"loss": loss, "mlm": mlm.detach(), "decoder": decoder.detach(), "bow": bow.detach()}

    def _decoder_loss(self, cls: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      ordinary: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Rebuild every ordinary token from ``cls (b, 1, h)`` and the context the row mask lets through."""
        length = input_ids.shape[1]
        positions = self.embeddings.position_embeddings(torch.arange(length, device=input_ids.device))
        query = cls + positions[None]
        context = torch.cat([cls, self.embeddings(input_ids=input_ids)[:, 1:]], dim=1)
        visible = decoder_attention_mask(attention_mask, self.config.decoder_mask_ratio, generator)
        logits = self.head(self.decoder(query, context, visible))
        labels = torch.where(ordinary, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
