"""The phrase encoder: any token span -> one input and one output embedding of the LM."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedModel

from ..tokens.padding import first_token_index, last_token_index, pad_sequences, position_ids_from_mask

logger = logging.getLogger(__name__)

#: ``encode_ids`` shows a progress bar from this many phrases (about ten seconds on 2 CPU threads)
PROGRESS_FROM = 50_000


def unwrap_model(model: nn.Module) -> PreTrainedModel:
    """The transformers model inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _layer_subset_config(config, num_layers: int):
    """A copy of ``config`` with only ``num_layers`` decoder layers."""
    config = copy.deepcopy(config)
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(config, name):
            setattr(config, name, num_layers)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    return config


class PhraseEncoder(nn.Module):
    """A small causal Transformer over the LM's tokenizer that maps a phrase to two vectors.

    The hidden state of the phrase's last token goes through an MLP to a vector in the
    LM's input-embedding space and one in its output-embedding space. Both are anchored
    on the LM's own embeddings: the output vector is ``W_out[first token] + Δ_out`` and
    the input vector ``W_in[last token] + Δ_in``, with the MLP's Δ starting near zero, so
    an untrained phrase scores like its first token and reads like its last one, and
    training learns when the whole phrase is the likelier continuation. Because the
    Transformer is causal, one pass over a phrase also yields the vectors of all its
    prefixes (``encode_prefixes``). The encoding does not depend on any prompt.

    Args:
        body: a transformers base model (e.g. ``LlamaModel``, ``GPT2Model``) with a few layers.
        output_size: hidden size of the LM the vectors are for.
        head_hidden_size: width of the MLP; defaults to ``output_size``.
        shares_embeddings: the body's token embeddings are the LM's own (not saved with the encoder).
    """

    def __init__(
        self,
        body: PreTrainedModel,
        output_size: int,
        head_hidden_size: int | None = None,
        shares_embeddings: bool = True,
    ) -> None:
        super().__init__()
        self.body = body
        self.shares_embeddings = shares_embeddings
        hidden = body.config.hidden_size
        self.output_size = output_size
        width = head_hidden_size or output_size
        self.head = nn.Sequential(nn.Linear(hidden, width), nn.GELU(), nn.Linear(width, 2 * output_size))
        nn.init.normal_(self.head[-1].weight, std=1e-3)  # Δ starts near zero: phrases start at their anchors
        nn.init.zeros_(self.head[-1].bias)
        self.head.to(dtype=body.dtype)
        self.__dict__["anchors"] = None  # the LM's (input, output) embeddings: borrowed, not registered or saved

    def attach(self, lm: nn.Module) -> "PhraseEncoder":
        """Anchor the vectors on ``lm``'s input and output embeddings (references, never copies)."""
        target = unwrap_model(lm)
        self.__dict__["anchors"] = (target.get_input_embeddings(), target.get_output_embeddings())
        return self

    def _anchored(self, deltas: torch.Tensor, first: torch.Tensor, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``Δ`` ``(..., 2d)`` plus the anchors of the first and last token ids ``(...)`` -> input, output vectors."""
        if self.anchors is None:
            raise RuntimeError("the phrase encoder is not attached to an LM; call encoder.attach(lm) first")
        embed_in, embed_out = self.anchors
        delta_in, delta_out = deltas.chunk(2, dim=-1)
        return embed_in(last) + delta_in, embed_out.weight[first] + delta_out

    @classmethod
    def from_causal_lm(
        cls,
        lm: nn.Module,
        num_layers: int = 1,
        head_hidden_size: int | None = None,
        encoder_model: str | PreTrainedModel | None = None,
    ) -> "PhraseEncoder":
        """Build the encoder from the first ``num_layers`` decoder layers of ``lm`` (copied).

        The token embeddings are shared with ``lm``, not copied. With ``encoder_model``
        the layers (and their own embeddings) come from that causal LM instead; it must
        use the same tokenizer.
        """
        target = unwrap_model(lm)
        if encoder_model is None:
            source, shares = target, True
        else:
            source = encoder_model
            if isinstance(source, str):
                source = AutoModelForCausalLM.from_pretrained(source, dtype=target.dtype)
            source, shares = unwrap_model(source), False
        available = _num_layers(source.config)
        if num_layers > available:
            raise ValueError(f"num_layers={num_layers} but the source model has only {available} decoder layers")
        body = AutoModel.from_config(_layer_subset_config(source.config, num_layers), dtype=source.dtype)
        weights = {name.replace(".base_layer", ""): p for name, p in source.base_model.state_dict().items() if "lora_" not in name}
        missing = [name for name in body.state_dict() if name not in weights]
        if missing:
            raise ValueError(f"cannot build the phrase encoder: weights {missing[:3]} are missing from the source model")
        body.load_state_dict({name: weights[name] for name in body.state_dict()})
        if shares:
            body.set_input_embeddings(target.get_input_embeddings())
        encoder = cls(body.to(target.device), target.config.hidden_size, head_hidden_size, shares_embeddings=shares)
        return encoder.to(target.device).attach(target)

    @classmethod
    def from_config_dict(cls, body_config: dict, output_size: int, head_hidden_size: int | None, shares: bool):
        """An encoder with random weights shaped by a saved body config (weights are loaded after)."""
        config = AutoConfig.for_model(**body_config)
        return cls(AutoModel.from_config(config), output_size, head_hidden_size, shares_embeddings=shares)

    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Body states ``(B, L, h)``; positions come from the mask, so padding side does not matter."""
        positions = position_ids_from_mask(attention_mask)
        return self.body(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).last_hidden_state

    def encode_prefixes(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Vectors of the prefixes ``input_ids[rows[i], :ends[i] + 1]`` (their non-padding part): one causal pass
        over ``(B, L)`` ids, the head only at the ``n`` prefix ends. Returns input and output vectors ``(n, d)``."""
        hidden = self._hidden(input_ids, attention_mask)
        first = input_ids.gather(1, first_token_index(attention_mask).unsqueeze(1))[:, 0]
        return self._anchored(self.head(hidden[rows, ends]), first[rows], input_ids[rows, ends])

    def encode_all_prefixes(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Vectors of every prefix: ``(B, L)`` ids -> input and output vectors ``(B, L, d)``.

        Position ``t`` holds the vectors of the phrase ``input_ids[b, :t + 1]`` (its
        non-padding part). Left or right padding both work.
        """
        batch, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device)
        rows = torch.arange(batch, device=input_ids.device).repeat_interleave(length)
        vec_in, vec_out = self.encode_prefixes(input_ids, attention_mask, rows, positions.repeat(batch))
        return vec_in.view(batch, length, -1), vec_out.view(batch, length, -1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Phrase vectors: ``(B, L)`` ids and mask -> input and output vectors ``(B, d)``."""
        hidden = self._hidden(input_ids, attention_mask)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        last = last_token_index(attention_mask)
        first = input_ids[rows, first_token_index(attention_mask)]
        return self._anchored(self.head(hidden[rows, last]), first, input_ids[rows, last])

    def encode_ids(
        self, phrases: Sequence[Sequence[int]], batch_size: int = 512, show_progress_bar: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode token-id phrases in length-sorted batches (little padding). Returns ``(n, d)`` twice.

        ``show_progress_bar=None`` shows one from ``PROGRESS_FROM`` phrases up (a million take minutes on a CPU;
        the few thousand of a prompt's phrase set, which generation encodes per prompt, get none).
        """
        device = self.head[0].weight.device
        order = sorted(range(len(phrases)), key=lambda i: len(phrases[i]))
        size = self.head[-1].out_features // 2
        inputs = torch.empty(len(phrases), size, dtype=self.head[0].weight.dtype, device=device)
        outputs = torch.empty_like(inputs)
        show = len(phrases) >= PROGRESS_FROM if show_progress_bar is None else show_progress_bar
        for start in tqdm(range(0, len(order), batch_size), desc="encoding phrases", unit="batch", disable=not show):
            chunk = order[start : start + batch_size]
            ids, mask = pad_sequences([phrases[i] for i in chunk], device=device)
            vec_in, vec_out = self(ids, mask)
            index = torch.tensor(chunk, device=device)
            inputs[index], outputs[index] = vec_in, vec_out
        return inputs, outputs

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The encoder's own weights (the shared token embeddings are left out)."""
        skip = "body." + _embedding_prefix(self.body) if self.shares_embeddings else None
        return {k: v for k, v in self.state_dict().items() if skip is None or not k.startswith(skip)}



def _num_layers(config) -> int:
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(config, name):
            return getattr(config, name)
    raise ValueError(f"cannot tell how many layers a {type(config).__name__} has")


def _embedding_prefix(body: PreTrainedModel) -> str:
    embedding = body.get_input_embeddings()
    return next(name for name, module in body.named_modules() if module is embedding) + "."
