"""``DynamicVocabLM``: any Hugging Face causal LM plus a phrase vocabulary that changes at run time."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import operator
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, LogitsProcessorList, PreTrainedModel, TextStreamer
from transformers.modeling_outputs import CausalLMOutputWithPast

from .config import DynamicVocabConfig
from .data.assets import resolve_model
from .decoding.agreement import FirstTokenMass, PhraseAgreement, PhraseBias
from .decoding.context_gate import PhraseContextGate, PhraseContexts, context_size
from .decoding.readback import WIDTHS_ATTRIBUTE, expansion_table, physical_inputs
from .decoding.repetition import (
    PhraseMaxUses,
    PhraseNGrams,
    PhraseNoRepeatNGram,
    PhraseRepetitionPenalty,
    check_no_repeat_scope,
)
from .hardware.precision import encode_autocast_dtype
from .phrases import mixed_ids
from .phrases.cache import PhraseVectorCache
from .phrases.encoder import PhraseEncoder, unwrap_model
from .phrases.store import PhraseVectorStore, encoder_fingerprint
from .phrases.table import PhraseLike, PhraseTable, as_phrase, phrase_list
from .scoring.dot_product import DotProductScorer
from .serialization import load, save, tokenizer_fingerprint
from .states.keys import StateGatedScorer, StateKeys

logger = logging.getLogger(__name__)

#: ``generate`` arguments that ``phrase_logits_processors`` turns into phrase-aware logits processors
PHRASE_PROCESSOR_ARGS = (
    "no_repeat_ngram_size", "no_repeat_ngram_scope", "repetition_penalty", "phrase_agreement_top_k", "phrase_max_uses",
    "phrase_first_token_mass", "phrase_bias", "phrase_contexts",
)


class DynamicVocabLM(PreTrainedModel, GenerationMixin):
    """A causal LM whose vocabulary is its own ``V`` tokens plus a run-time phrase table.

    Phrase ``i`` has id ``V + i``. As an input it is embedded by the phrase encoder's
    input vector; as an output it is scored ``h · e_out`` next to the LM's own logits,
    so ``forward`` returns logits over ``V + len(phrases)`` and ``generate()`` emits a
    whole phrase in one step. The LM's weights and architecture are left as they are;
    its embedding matrices are used in place, never copied.

    Build one with ``DynamicVocabLM.from_causal_lm(model, tokenizer)``.
    """

    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = False
    _keys_to_ignore_on_save = None

    def __init__(
        self,
        lm: nn.Module,
        tokenizer,
        phrase_encoder: PhraseEncoder,
        config: DynamicVocabConfig,
    ) -> None:
        base = unwrap_model(lm)
        super().__init__(base.config)
        self.lm = lm
        self.tokenizer = tokenizer
        self.phrase_encoder = phrase_encoder
        self.scorer: nn.Module = DotProductScorer()
        self.dynvocab_config = config
        self.generation_config = base.generation_config
        self.vocab_size = base.get_input_embeddings().num_embeddings
        self.phrase_table = PhraseTable(tokenizer, self.vocab_size, config.max_phrase_tokens)
        self._encoded_version: int | None = None
        #: output vectors of phrases encoded so far, by token ids: free when a later phrase set brings them back
        self.phrase_cache = PhraseVectorCache(config.phrase_cache_mb * 2**20)
        self._cache_key: tuple | None = None  # the encoder version and dtypes the cached vectors were made with
        #: output vectors computed ahead of time, read before encoding (``use_phrase_store``)
        self.phrase_store: PhraseVectorStore | None = None
        self._store_key: tuple | None = None  # the encoder version and dtypes the store was checked against
        self._expansion_key: tuple | None = None  # the table version and device the read-back's lookup was built for
        self._expansion_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self._ngrams_key: tuple | None = None  # the table version and n the no-repeat rule's lookups were built for
        self._ngrams: PhraseNGrams | None = None
        self._lm_takes_logits_to_keep = "logits_to_keep" in inspect.signature(base.forward).parameters
        self._warned_readback: str | None = None  # generate() warns once per read-back the encoder was not trained for
        self._generating_width: int | None = None  # the table's size when the running generate() began

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_causal_lm(cls, model: nn.Module | str, tokenizer=None, **config) -> "DynamicVocabLM":
        """Wrap a causal LM (a ``PreTrainedModel``, a peft model, or a Hub name or path).

        ``config`` holds ``DynamicVocabConfig`` fields, e.g. ``encoder_layers=2``.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, (str, os.PathLike)):
            path = resolve_model(model)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a causal LM (nn.Module), a Hub name or a path, got {type(model).__name__}")
        if tokenizer is None:
            raise ValueError("tokenizer is required when model is a model object; pass the LM's own tokenizer")
        known = {f.name for f in dataclasses.fields(DynamicVocabConfig)}
        if set(config) - known:
            raise TypeError(
                f"from_causal_lm got unknown settings {sorted(set(config) - known)}; DynamicVocabConfig takes {sorted(known)}"
            )
        settings = DynamicVocabConfig(**config)
        base = unwrap_model(model)
        _check_vocab(base, tokenizer)
        encoder = PhraseEncoder.from_causal_lm(
            model, settings.encoder_layers, settings.head_hidden_size, settings.encoder_model
        )
        settings.base_model_type = base.config.model_type
        settings.base_hidden_size = base.config.hidden_size
        settings.base_vocab_size = base.get_input_embeddings().num_embeddings
        settings.tokenizer_fingerprint = tokenizer_fingerprint(tokenizer)
        return cls(model, tokenizer, encoder, settings)

    def get_input_embeddings(self) -> nn.Module:
        return self.lm.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.lm.get_output_embeddings()

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing to initialise: the LM is pretrained and the encoder is built from it."""

    # ------------------------------------------------------------------ phrases
    @property
    def phrases(self) -> list:
        """The phrases that may be emitted (removed ones left out), in id order."""
        return [self.phrase_table.phrases[i] for i in self.phrase_table.live_indices()]

    def set_phrases(
        self, phrases: Sequence[PhraseLike] | Sequence[Sequence[PhraseLike]], mid_sentence_forms: bool = True
    ) -> None:
        """Replace the phrase set. A list of lists gives each batch row its own set.

        Vectors of phrases already in the table are reused; only new ones are encoded.
        With ``mid_sentence_forms`` a phrase written without its leading space also enters
        in the form running text uses (``PhraseTable.with_mid_sentence_forms``); phrases cut from
        documents already carry their space and are passed with it off.
        """
        items = phrase_list(phrases)
        kinds = {isinstance(p, (list, tuple)) for p in items}
        if len(kinds) > 1:
            raise TypeError(
                "set_phrases takes a list of phrases (shared by every row) or a list of lists (one per prompt), "
                "not a mix of phrases and lists; wrap the lone phrases in a list of their own"
            )
        per_row = kinds == {True}
        rows = [phrase_list(row, f"phrases[{i}]") for i, row in enumerate(items)] if per_row else [items]
        self.phrase_table.set_rows(rows, per_row, mid_sentence_forms)
        self.refresh_phrase_vectors(only_new=True)

    def add_phrases(self, phrases: Sequence[PhraseLike], mid_sentence_forms: bool = True) -> None:
        """Add phrases to the shared set (every row may use them); only new ones are encoded.

        Safe during ``generate()``, with per-row sets too: the new phrases get new ids and
        every row may use them from the next step on.
        """
        phrases = phrase_list(phrases)
        self.phrase_table.add(self.phrase_table.with_mid_sentence_forms(phrases) if mid_sentence_forms else phrases)
        self.refresh_phrase_vectors(only_new=True)

    def remove_phrases(self, phrases: Sequence[PhraseLike]) -> None:
        """Remove phrases: they are never emitted or matched again. Unknown phrases are warned about.

        No id changes: an id emitted before the removal still decodes to its phrase, so
        removing during ``generate()`` never changes what was already written. Adding a
        removed phrase again brings back its id; ``set_phrases`` starts a new numbering.
        """
        phrases = [as_phrase(p) for p in phrase_list(phrases)]
        unknown = [p.text for p in phrases if p not in self.phrase_table]
        if unknown:
            logger.warning("remove_phrases: %d phrase(s) not in the table, ignored: %s", len(unknown), unknown[:5])
        removed = {p.text for p in self.phrase_table.with_mid_sentence_forms(phrases)}
        self.phrase_table.remove(i for i, p in enumerate(self.phrase_table.phrases) if p.text in removed)

    def _encoder_version(self) -> int:
        return sum(p._version for p in self.phrase_encoder.parameters())

    @torch.no_grad()
    def refresh_phrase_vectors(self, only_new: bool = False) -> None:
        """Vectors for the table's phrases: the ones without vectors, or all when the encoder changed; each comes from
        ``phrase_cache`` when an earlier phrase set had it encoded."""
        table, version = self.phrase_table, self._encoder_version()
        if not only_new or self._encoded_version != version:
            table.forget_vectors()
        todo = table.token_ids[table.num_encoded :]
        if todo:
            table.append_output_vectors(self._output_vectors(todo, version))
        self._encoded_version = version

    def use_phrase_store(self, store: PhraseVectorStore | str | Path | None) -> None:
        """Read phrase output vectors from ``store`` (a ``PhraseVectorStore`` or its folder) before encoding any;
        None stops. The store must come from this phrase encoder and dtypes; once the encoder's weights change
        it is no longer read."""
        if store is None:
            self.phrase_store = self._store_key = None
            return
        store = store if isinstance(store, PhraseVectorStore) else PhraseVectorStore(store)
        settings = self.dynvocab_config
        fingerprint = encoder_fingerprint(self.phrase_encoder, settings.encode_dtype, settings.phrase_dtype)
        if store.fingerprint != fingerprint:
            raise ValueError(
                f"the phrase vectors in {store.directory} were computed by another phrase encoder, or with other "
                f"dtypes than encode_dtype={settings.encode_dtype!r}, phrase_dtype={settings.phrase_dtype!r}; "
                "compute them again with `dynvocab phrase-vectors --index <index folder> --overwrite` and this model"
            )
        self.phrase_store = store
        self._store_key = (self._encoder_version(), settings.encode_dtype, settings.phrase_dtype)

    def _output_vectors(self, token_ids: list[tuple[int, ...]], version: int) -> torch.Tensor:
        """Output vectors ``(n, d)`` of ``token_ids`` in ``phrase_dtype``: cached or stored ones reused, the rest encoded."""
        settings = self.dynvocab_config
        key = (version, settings.encode_dtype, settings.phrase_dtype)
        if key != self._cache_key:  # vectors of another encoder (or dtype) must not be served
            self.phrase_cache.clear()
            self._cache_key = key
        dtype = getattr(torch, settings.phrase_dtype)
        found, missing = self.phrase_cache.split(token_ids)
        vectors = torch.empty(len(token_ids), self.phrase_encoder.output_size, dtype=dtype, device=self.device)
        if found:
            vectors[list(found)] = torch.stack(list(found.values())).to(self.device, dtype)
        if missing and self._store_usable(key):
            positions, stored = self.phrase_store.lookup([token_ids[i] for i in missing])
            vectors[[missing[p] for p in positions]] = stored.to(self.device, dtype)
            hit = set(positions)
            missing = [i for p, i in enumerate(missing) if p not in hit]
        if missing:
            encoded = self._encode([token_ids[i] for i in missing])[1].to(dtype)
            self.phrase_cache.put([token_ids[i] for i in missing], encoded)
            vectors[missing] = encoded.to(self.device)
        return vectors

    def _store_usable(self, key: tuple) -> bool:
        """Whether ``phrase_store`` was checked against the encoder version and dtypes ``key``."""
        return self.phrase_store is not None and key == self._store_key

    @torch.no_grad()
    def encode_output_vectors(self, token_ids: list[tuple[int, ...]]) -> torch.Tensor:
        """Output vectors ``(n, d)`` of token-id phrases, freshly encoded in ``phrase_dtype`` (no cache, no store)."""
        return self._encode(token_ids)[1].to(getattr(torch, self.dynvocab_config.phrase_dtype))

    def _encode(self, token_ids: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Input and output vectors ``(n, d)`` of ``token_ids``, in eval mode and ``encode_dtype``."""
        was_training = self.phrase_encoder.training
        self.phrase_encoder.eval()
        dtype = encode_autocast_dtype(self.dynvocab_config.encode_dtype, self.device)
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            vectors = self.phrase_encoder.encode_ids(token_ids, self.dynvocab_config.encode_batch_size)
        self.phrase_encoder.train(was_training)
        return vectors

    @torch.no_grad()
    def _cached_input_vectors(self, indices: list[int]) -> torch.Tensor:
        """Input vectors of table phrases ``indices``, encoded on first use. ``(len(indices), d)``."""
        cache = self.phrase_table.input_vectors
        missing = sorted({i for i in indices if i not in cache})
        if missing:
            vectors = self._encode([self.phrase_table.token_ids[i] for i in missing])[0]
            cache.update(zip(missing, vectors))
        return torch.stack([cache[i] for i in indices])

    def _cached_vectors(self) -> tuple[None, torch.Tensor | None]:
        """Output vectors of the table, refreshed if stale; input vectors come lazily (None here)."""
        table = self.phrase_table
        if len(table) and (table.num_encoded < len(table) or self._encoded_version != self._encoder_version()):
            self.refresh_phrase_vectors()
        return None, table.output_vectors

    # ------------------------------------------------------------------ text
    def tokenize(self, text_: str, row: int | None = None) -> list[int]:
        """Token and phrase ids of ``text_`` by forward maximum matching (one row's set if ``row`` is given)."""
        if not isinstance(text_, str):
            raise TypeError(f"tokenize takes a str, got {type(text_).__name__} {text_!r}; tokenize one text at a time")
        allowed = None
        if row is not None:
            rows = self.phrase_table.num_rows or 1
            row = row if isinstance(row, bool) or not hasattr(row, "__index__") else operator.index(row)  # numpy ints
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < rows:
                raise ValueError(
                    f"row={row!r} is not a row of the phrase sets: set_phrases gave {rows} row(s); pass 0..{rows - 1} or None"
                )
            masks = self.phrase_table.row_masks()
            if masks is not None:
                allowed = set(masks[row].nonzero().flatten().tolist())
        return mixed_ids.tokenize(text_, self.tokenizer, self.phrase_table, allowed)

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = False) -> str:
        return mixed_ids.decode(_as_list(ids), self.tokenizer, self.phrase_table, skip_special_tokens)

    def segments(
        self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = False, row: int | None = None
    ) -> list[mixed_ids.Segment]:
        """Each phrase of ``ids`` and each run of tokens between them, with phrase sources.

        After ``set_phrases`` with one list per row, ``row`` gives the sources of that row's set
        (the same text may come from another document in another row).
        """
        sources = None if row is None else self.phrase_table.row_sources(row)
        return mixed_ids.segments(_as_list(ids), self.tokenizer, self.phrase_table, skip_special_tokens, sources)

    def text_streamer(self, skip_prompt: bool = True, **decode_kwargs) -> TextStreamer:
        """A ``TextStreamer`` for ``generate(streamer=...)`` that prints phrases as text."""
        return TextStreamer(mixed_ids.PhraseAwareDecoder(self.tokenizer, self.phrase_table), skip_prompt, **decode_kwargs)

    # ------------------------------------------------------------------ forward
    def embed(self, input_ids: torch.Tensor, phrase_inputs: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, T)`` mixed ids -> ``(B, T, d)`` input embeddings (phrase ids take phrase vectors).

        ``phrase_inputs`` ``(P, d)`` are the phrases' input vectors; None uses the table's.
        """
        embeddings = self.lm.get_input_embeddings()
        if not input_ids.numel():
            return embeddings(input_ids)
        smallest, largest = torch.stack(torch.aminmax(input_ids)).tolist()  # one device sync for both checks
        if smallest < 0:
            raise ValueError(f"input id {smallest} is negative; ids are 0..V-1 for tokens and V.. for phrases")
        if largest < self.vocab_size:
            return embeddings(input_ids)
        num_phrases = len(self.phrase_table) if phrase_inputs is None else phrase_inputs.shape[0]
        if largest >= self.vocab_size + num_phrases:
            raise ValueError(
                f"input id {largest} is past the vocabulary: V={self.vocab_size} plus {num_phrases} phrases; "
                "set the phrases before using their ids"
            )
        is_phrase = input_ids >= self.vocab_size
        tokens = embeddings(input_ids.masked_fill(is_phrase, 0))
        indices = input_ids[is_phrase] - self.vocab_size
        if phrase_inputs is None:
            phrase_rows = self._cached_input_vectors(indices.tolist()).to(tokens.dtype)
        else:
            phrase_rows = phrase_inputs[indices].to(tokens.dtype)
        return tokens.masked_scatter(is_phrase.unsqueeze(-1), phrase_rows)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        phrase_mask: torch.Tensor | None = None,
        phrase_vectors: tuple[torch.Tensor, torch.Tensor] | None = None,
        output_hidden_states: bool | None = None,
        readback_widths: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits over ``V + P``: the LM's own next to ``h · e_out(p)`` for every phrase.

        Args:
            input_ids: ``(B, T)`` ids; ids ``>= V`` are phrases.
            phrase_mask: ``(B, P)`` bool, which phrases each row may emit (default: the
                per-row sets given to ``set_phrases``, else all).
            phrase_vectors: ``(P, d)`` input and output vectors to use instead of the
                cached table (training passes freshly encoded, differentiable ones).
            labels: ``(B, T)`` mixed ids; the loss is next-id cross-entropy over ``V + P``.
            readback_widths: set by ``prepare_inputs_for_generation`` under ``readback="tokens"``:
                the slots each logical step takes in the cache, recorded on it.
        """
        vec_in, vec_out = phrase_vectors if phrase_vectors is not None else self._cached_vectors()
        if inputs_embeds is None and readback_widths is not None:  # the token read-back's own tokens, all < V
            inputs_embeds = self.lm.get_input_embeddings()(input_ids)
        elif inputs_embeds is None:
            inputs_embeds = self.embed(input_ids, vec_in)
        if phrase_mask is None and self.phrase_table.num_rows is not None and phrase_vectors is None:
            phrase_mask = self._default_row_mask(inputs_embeds.shape[0])
        if phrase_vectors is None:
            phrase_mask = self._live_phrase_mask(phrase_mask, inputs_embeds.shape[0], inputs_embeds.device)
        kwargs.pop("return_dict", None)
        if self._lm_takes_logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        # the phrases are scored on what the LM's output layer reads (its last, normed states, at the positions it
        # keeps): caught on the way in, instead of asking the LM for every layer's states at every step
        seen: list[torch.Tensor] = []
        hook = self.lm.get_output_embeddings().register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0]))
        try:
            out = self.lm(
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=use_cache,
                output_hidden_states=bool(output_hidden_states),
                return_dict=True,
                **kwargs,
            )
        finally:
            hook.remove()
        if readback_widths is not None and out.past_key_values is not None:
            setattr(out.past_key_values, WIDTHS_ATTRIBUTE, readback_widths)
        logits = out.logits
        if vec_out is not None and vec_out.shape[0]:
            hidden = seen[-1]
            if phrase_mask is not None:
                phrase_mask = _checked_phrase_mask(phrase_mask, hidden.shape[0], vec_out.shape[0]).to(hidden.device)
            logits = self._with_phrase_scores(logits, hidden, vec_out, phrase_mask)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device), ignore_index=-100
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=out.past_key_values,
            hidden_states=out.hidden_states if output_hidden_states else None,
        )

    def _with_phrase_scores(self, logits: torch.Tensor, hidden: torch.Tensor, vec_out: torch.Tensor,
                            phrase_mask: torch.Tensor | None) -> torch.Tensor:
        """``(B, T, V)`` LM logits and the ``(B, T, d)`` states they were read from -> ``(B, T, V + P)`` logits with the
        calibrated phrase scores beside them. A scorer with a ``sparse`` method (``ShortlistScorer``) has its
        candidates' scores written straight into the logits: a table of a million phrases is filled once a step,
        not built and then copied, and only the candidates are calibrated and masked."""
        sparse = getattr(self.scorer, "sparse", None)
        found = sparse(hidden, vec_out) if sparse is not None else None
        if found is None:
            dense = self._calibrated(self.scorer(hidden, vec_out, phrase_mask))
            return torch.cat([logits, dense.to(logits.dtype)], dim=-1)
        ids, scores = found  # (B, T, C) each; id P pads
        vocab, table = logits.shape[-1], vec_out.shape[0]
        off, slots = ids >= table, ids.clamp(max=table - 1)
        if phrase_mask is not None:
            off |= ~phrase_mask[:, None, :].expand(-1, ids.shape[1], -1).gather(2, slots)
        full = logits.new_full((*logits.shape[:-1], vocab + table), float("-inf"))
        full[..., :vocab] = logits
        # a pad lands on a real id with -inf, which the max leaves alone: no nonzero, so no GPU synchronisation
        scores = self._calibrated(scores).masked_fill(off, float("-inf")).to(full.dtype)
        full[..., vocab:].scatter_reduce_(-1, slots, scores, reduce="amax")
        return full

    def _calibrated(self, scores: torch.Tensor) -> torch.Tensor:
        """``scale * scores + bias`` from the config (a ``-inf`` of a masked phrase stays ``-inf``)."""
        scale, bias = self.dynvocab_config.phrase_score_scale, self.dynvocab_config.phrase_score_bias
        return scores if (scale, bias) == (1.0, 0.0) else scores * scale + bias

    def _live_phrase_mask(self, mask: torch.Tensor | None, batch: int, device: torch.device) -> torch.Tensor | None:
        """``mask`` widened to phrases added since it was made (shared: every row may use them) and with
        removed phrases masked out; None when every row may use every phrase."""
        table, width = len(self.phrase_table), self._generating_width
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and width is not None and mask.shape[1] == width < table:
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], table - width)], dim=1)
        live = self.phrase_table.live_mask(device)
        if live is None:
            return mask
        if mask is None:
            return live.expand(batch, -1)
        return _checked_phrase_mask(mask, batch, table).to(device) & live

    def _default_row_mask(self, batch_size: int) -> torch.Tensor:
        masks = self.phrase_table.row_masks()
        rows = masks.shape[0]
        if batch_size != rows:
            raise ValueError(
                f"set_phrases gave {rows} per-row phrase sets but the batch has {batch_size} rows; pass one phrase "
                "list per row to set_phrases, or a phrase_mask of shape (batch, phrases)"
            )
        return masks

    # ------------------------------------------------------------------ generation
    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, past_key_values=None, attention_mask=None,
                                      inputs_embeds: torch.Tensor | None = None, **kwargs) -> dict:
        """``generate``'s per-step inputs; under ``readback="tokens"`` an emitted phrase is fed as its tokens.

        ``input_ids`` ``(B, L)`` are all logical ids so far. The cache records how many
        slots each step took, so only the steps it lacks are expanded and fed.
        """
        if self.dynvocab_config.readback != "tokens":
            return super().prepare_inputs_for_generation(
                input_ids, past_key_values=past_key_values, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                **kwargs,
            )
        if inputs_embeds is not None:
            raise ValueError("readback='tokens' feeds phrases as their token ids, so generate() needs input_ids, not "
                             "inputs_embeds; pass input_ids or set model.dynvocab_config.readback = 'vector'")
        return self.token_readback_inputs(input_ids, past_key_values, attention_mask, **kwargs)

    def token_readback_inputs(self, input_ids: torch.LongTensor, past_key_values=None, attention_mask=None,
                              **kwargs) -> dict:
        """One step's inputs under the token read-back, whatever ``dynvocab_config.readback`` says: the steps the
        cache lacks, each emitted phrase fed as its tokens (``dynvocab.decoding.readback``).

        ``input_ids`` ``(B, L)`` are all logical ids so far; the returned ``input_ids`` ``(B, l)`` physical ones.
        """
        for handled_here in ("next_sequence_length", "position_ids", "is_first_iteration"):
            kwargs.pop(handled_here, None)
        cached = None
        if past_key_values is not None and past_key_values.get_seq_length() > 0:
            cached = getattr(past_key_values, WIDTHS_ATTRIBUTE, None)
            if cached is None:  # a cache filled one slot per step (e.g. by the vector read-back)
                cached = torch.ones(past_key_values.get_seq_length(), dtype=torch.long, device=input_ids.device)
        table, lengths = self._expansions(input_ids.device)
        physical = physical_inputs(input_ids, attention_mask, cached, self.vocab_size, table, lengths)
        inputs = {
            "input_ids": physical.input_ids, "attention_mask": physical.attention_mask,
            "position_ids": physical.position_ids, "past_key_values": past_key_values,
            "readback_widths": physical.widths,
        }
        return inputs | {k: v for k, v in kwargs.items() if k not in ("labels",)}

    def _phrase_ngrams(self, n: int) -> PhraseNGrams:
        """The phrase table's n-gram lookups for ``no_repeat_ngram_size=n``, rebuilt when the table changes."""
        key = (self.phrase_table.version, n)
        if self._ngrams_key != key:
            self._ngrams, self._ngrams_key = PhraseNGrams(n, self.phrase_table.token_ids), key
        return self._ngrams

    def _expansions(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The phrase table's tokens for the token read-back, rebuilt when the table changes."""
        key = (self.phrase_table.version, device)  # one integer per step, not the whole table
        if self._expansion_key != key:
            self._expansion_cache = expansion_table(self.phrase_table.token_ids or [(0,)], device)
            self._expansion_key = key
        return self._expansion_cache

    def generate(self, *args, **kwargs):
        """``transformers`` generation over tokens and phrases; takes all the usual arguments.

        Per-row phrase sets follow their rows through beam search and
        ``num_return_sequences``. Returned ids ``>= V`` are phrases: see ``decode`` and
        ``segments``. ``no_repeat_ngram_size`` and ``repetition_penalty`` count a phrase
        as the tokens it spells (``dynvocab.decoding.repetition``), so a phrase cannot loop;
        ``no_repeat_ngram_scope="new"`` counts only the n-grams this call writes, not the
        prompt's (an answer may copy its documents, but not repeat itself);
        ``phrase_agreement_top_k=k`` lets a phrase start only with one of the LM's top-k
        tokens (``dynvocab.decoding.agreement``); ``phrase_first_token_mass=True`` keeps the LM's
        own next-token distribution and lets phrases share their first token's mass;
        ``phrase_max_uses=n`` emits each phrase at most ``n`` times per row;
        ``phrase_bias=b`` adds ``b`` to every phrase score, before the rest;
        ``phrase_contexts`` lets a phrase follow only the left contexts it was seen after
        (``dynvocab.decoding.context_gate``); ``phrase_state_keys`` lets it compete only where the LM's state is close to
        its state before the phrase in a document (``dynvocab.states.keys``).
        """
        inputs = kwargs.get("input_ids", args[0] if args else None)
        if inputs is not None:
            self._check_prompt_ids(inputs)
        mismatch = self.dynvocab_config.readback_mismatch()
        if mismatch and mismatch != self._warned_readback:
            logger.warning(mismatch)
            self._warned_readback = mismatch
        self._cached_vectors()
        kwargs = self._phrase_aware_repetition(kwargs)
        keys = kwargs.pop("phrase_state_keys", None)
        masks = self.phrase_table.row_masks()
        if masks is not None and kwargs.get("phrase_mask") is None:
            batch = inputs.shape[0] if inputs is not None else kwargs["inputs_embeds"].shape[0]
            if batch != masks.shape[0]:
                raise ValueError(
                    f"set_phrases was given {masks.shape[0]} phrase lists but generate() got {batch} prompts; give "
                    "one list per prompt"
                )
            kwargs["phrase_mask"] = masks.to(self.device)
        self._generating_width = len(self.phrase_table)
        # the scores are V + P wide; beam search in transformers 5.17 (not 5.23) reads their width off the config
        text_config = self.config.get_text_config()
        base_vocab, text_config.vocab_size = text_config.vocab_size, self.vocab_size + len(self.phrase_table)
        try:
            with self.state_gate(keys):
                return super().generate(*args, **kwargs)
        finally:
            self._generating_width = None
            text_config.vocab_size = base_vocab

    @contextlib.contextmanager
    def state_gate(self, keys: StateKeys | None):
        """Inside the block a phrase competes only where ``keys`` open it (``dynvocab.states.keys``); None: no gate.
        ``generate(phrase_state_keys=...)`` does this for its call."""
        scorer = self.scorer
        if keys is not None:
            self.scorer = StateGatedScorer(scorer, keys.to(self.device))
        try:
            yield self
        finally:
            self.scorer = scorer

    def _check_prompt_ids(self, ids) -> None:
        """Refuse prompt ids ``generate`` cannot run, naming the problem: not an integer tensor, empty, or out of range."""
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            what = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise TypeError(f"generate() takes prompt ids as an integer tensor of shape (batch, length), got {what}; "
                            "pass torch.tensor(ids, dtype=torch.long), or ids.long()")
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ValueError(
                f"generate() got prompt ids of shape {tuple(ids.shape)}: a prompt needs at least one token in a (batch, "
                "length) tensor; pass ids[None] for one prompt, or start an empty prompt with the tokenizer's BOS token"
            )
        smallest, largest = torch.stack(torch.aminmax(ids)).tolist()
        limit = self.vocab_size + len(self.phrase_table)
        if smallest < 0 or largest >= limit:
            bad = smallest if smallest < 0 else largest
            raise ValueError(
                f"prompt id {bad} is outside the vocabulary: ids are 0..{self.vocab_size - 1} for tokens and "
                f"{self.vocab_size}..{limit - 1} for the {len(self.phrase_table)} phrases of the table; tokenize the prompt "
                "with this model's tokenizer (or model.tokenize), after set_phrases"
            )

    def phrase_processors_in(self, kwargs: dict) -> LogitsProcessorList:
        """``phrase_logits_processors`` for the ``PHRASE_PROCESSOR_ARGS`` among ``kwargs`` (``generate``'s, or a
        config's ``generation_kwargs()``); the other keys are not read."""
        return self.phrase_logits_processors(**{k: kwargs[k] for k in PHRASE_PROCESSOR_ARGS if k in kwargs})

    def _phrase_aware_repetition(self, kwargs: dict) -> dict:
        """Swap the ``PHRASE_PROCESSOR_ARGS`` of ``kwargs`` for ``phrase_logits_processors``."""
        processors = self.phrase_processors_in(kwargs)
        for name in PHRASE_PROCESSOR_ARGS:
            kwargs.pop(name, None)
        if processors:
            kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), *processors])
        return kwargs

    def phrase_logits_processors(
        self, no_repeat_ngram_size: int | None = None, no_repeat_ngram_scope: str = "all",
        repetition_penalty: float | None = None,
        phrase_agreement_top_k: int | None = None, phrase_max_uses: int | None = None,
        phrase_first_token_mass: bool = False, phrase_bias: float = 0.0,
        phrase_contexts: PhraseContexts | Sequence[PhraseContexts | None] | None = None,
    ) -> LogitsProcessorList:
        """The phrase-aware processors for these settings (None or off: left out), over the current phrase table.

        ``PhraseBias`` comes first, so the guards see biased scores; ``FirstTokenMass`` comes
        last, so it shares out what the guards before it left.
        """
        check_no_repeat_scope(no_repeat_ngram_scope)
        token_ids, vocab = self.phrase_table.token_ids, self.vocab_size
        processors = [PhraseBias(phrase_bias, vocab)] if phrase_bias else []
        if phrase_contexts is not None:
            processors.append(self._context_gate(phrase_contexts))
        if phrase_agreement_top_k:
            processors.append(PhraseAgreement(phrase_agreement_top_k, vocab, token_ids))
        if phrase_max_uses:
            processors.append(PhraseMaxUses(phrase_max_uses, vocab))
        if no_repeat_ngram_size:
            processors.append(PhraseNoRepeatNGram(no_repeat_ngram_size, vocab, token_ids, no_repeat_ngram_scope,
                                                  self._phrase_ngrams(no_repeat_ngram_size)))
        if repetition_penalty is not None and repetition_penalty != 1.0:
            processors.append(PhraseRepetitionPenalty(repetition_penalty, vocab, token_ids))
        if phrase_first_token_mass:
            processors.append(FirstTokenMass(vocab, token_ids))
        return LogitsProcessorList(processors)

    def _context_gate(self, contexts: PhraseContexts | Sequence[PhraseContexts | None]) -> PhraseContextGate:
        """``phrase_contexts`` (one mapping, or one per row) as a gate over this table's indices."""
        rows = [contexts] if isinstance(contexts, Mapping) else list(contexts) if isinstance(contexts, Sequence) else []
        if not rows or not all(row is None or isinstance(row, Mapping) for row in rows) or isinstance(contexts, str):
            raise TypeError(
                "phrase_contexts must be a mapping {n context token ids: phrases' token ids} or a non-empty list of "
                f"them (one per prompt, None for an ungated one), got {type(contexts).__name__}; build each with "
                "dynvocab.decoding.context_gate.left_contexts"
            )
        for row in rows:
            if row:
                context_size(row)  # one n per mapping, refused with the fix before any step
        index_of = self.phrase_table.index_of_ids  # a phrase not in the table (or removed) is left out
        gates = [
            None if row is None else {
                context: torch.tensor(indices, dtype=torch.long) for context, phrases in row.items()
                if (indices := [i for i in map(index_of, map(tuple, phrases)) if i is not None])
            }
            for row in rows
        ]
        return PhraseContextGate(gates, self.vocab_size, self.phrase_table.token_ids)

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, save_directory, save_phrases: bool = False, **unknown) -> None:
        """Write the config JSON and the phrase encoder's safetensors (and the phrases if asked).

        The LM itself is not written: ``from_pretrained`` puts the encoder back on a base
        LM the caller passes. The directory is replaced atomically.
        """
        _refuse_unknown("save_pretrained", unknown, "save_directory and save_phrases; save the LM with its own save_pretrained")
        save(self, save_directory, save_phrases)

    @classmethod
    def from_pretrained(cls, directory, base_model: nn.Module, tokenizer, verify: bool = True, **unknown) -> "DynamicVocabLM":
        """Restore a saved model on ``base_model`` (which must match the saved tokenizer and hidden size).

        Every file is checked against the manifest written with it; ``verify=False`` accepts a
        folder whose files were edited on purpose since (a config changed by hand), with a warning.
        """
        _refuse_unknown("from_pretrained", unknown, "directory, base_model, tokenizer and verify; load the base LM yourself first")
        return load(cls, directory, base_model, tokenizer, verify_files=verify)

    def phrase_output_vectors(self) -> torch.Tensor | None:
        """The phrase table's output vectors ``(P, d)``, re-encoded first if the encoder changed since; None when empty."""
        return self._cached_vectors()[1]

    def restore_phrase_output_vectors(self, vectors: torch.Tensor) -> None:
        """Take saved output vectors ``(P, d)`` of the table's phrases as current (they were encoded by this encoder)."""
        if vectors.shape[0] != len(self.phrase_table) - self.phrase_table.num_encoded:
            raise ValueError(
                f"got {vectors.shape[0]} vectors for {len(self.phrase_table) - self.phrase_table.num_encoded} "
                "phrases without one; pass one row per phrase"
            )
        self.phrase_table.append_output_vectors(vectors)
        self._encoded_version = self._encoder_version()


def _as_list(ids) -> list[int]:
    """One sequence of ids as ints; a 2-D tensor, floats, strings or negative ids raise naming the problem."""
    if ids is None or not hasattr(ids, "__iter__"):
        raise TypeError(f"ids must be a sequence of ints (or a 1-D tensor), got {type(ids).__name__} {ids!r}; pass the "
                        "ids generate() returned, e.g. out[0]")
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"expected one sequence of ids, got a tensor of shape {tuple(ids.shape)}; pass ids[row]")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"ids must be an integer tensor, got dtype {ids.dtype}; pass ids.long()")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"ids must be a sequence of ints, got {type(ids).__name__} {ids[:20]!r}; decode ids, not text")
    try:
        ids = [operator.index(i) for i in ids]
    except TypeError:
        raise TypeError(f"ids must be a sequence of ints, got {list(ids)[:5]!r}...; pass integer token and phrase ids") from None
    if ids and min(ids) < 0:
        raise ValueError(f"id {min(ids)} is negative; ids are 0..V-1 for tokens and V.. for phrases")
    return ids


def _checked_phrase_mask(mask: torch.Tensor, batch: int, num_phrases: int) -> torch.Tensor:
    """A ``(batch, P)`` bool mask, or ``TypeError``/``ValueError`` saying what shape and dtype it must have."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        what = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"phrase_mask must be a bool tensor of shape (batch, phrases), got {what}; pass mask.bool()")
    if tuple(mask.shape) != (batch, num_phrases):
        raise ValueError(
            f"phrase_mask has shape {tuple(mask.shape)}, but the batch has {batch} rows and the table {num_phrases} "
            f"phrases; pass a ({batch}, {num_phrases}) bool tensor"
        )
    return mask


def _check_vocab(base: PreTrainedModel, tokenizer) -> None:
    rows = base.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the LM's embedding matrix has {rows} rows; "
            "pass the LM's own tokenizer (or resize the LM's embeddings first)"
        )


def _refuse_unknown(method: str, unknown: dict, takes: str) -> None:
    if unknown:
        raise TypeError(f"DynamicVocabLM.{method}() got unknown arguments {sorted(unknown)}; it takes {takes}")
