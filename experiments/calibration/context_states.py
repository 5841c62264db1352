"""Does a phrase fit where the LM's state is close to its state before that phrase in a document? (#32, a probe)

The copy-rule probe (``copy_rule.py``) showed that the retrieved documents know when a phrase fits better than the
phrase head does, when the last ``n`` tokens of the text match the ``n`` tokens before the phrase exactly. This probe
asks the same with a soft match, as kNN-LM and CoG do: each place a plugged-in phrase starts in a retrieved document
keeps the frozen LM's last hidden state just before it (the state that predicts the phrase's first token). At each
teacher-forced position of a held-out lead the phrase whose key is closest to the LM's state there (cosine; of
equally close ones the shortest) is *proposed* when the similarity reaches a threshold, optionally only if its
first token is among the LM's top k. No phrase head and no training. Figures as in the calibration report:
proposals, precision (a proposal spells the reference), recall (of positions where some plugged-in phrase fits) and
next-item accuracy when a proposal replaces the LM's top token, against the LM alone.

    python experiments/calibration/context_states.py --num-prompts 200 --output results/calibration/states/reported.json
    python experiments/calibration/context_states.py --skip 200 --num-prompts 100 --output results/calibration/states/dev.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from copy_rule import report  # the sibling probe's table and JSON (the script's folder is on the import path)
from tqdm.auto import tqdm

from dynvocab.decoding.context_gate import phrase_starts
from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
from evals.calibration import fitting_phrases
from evals.protocol import EvalConfig, held_out_prompts
from retrieval.config import PipelineConfig
from retrieval.loading import demo_index
from retrieval.pipeline import PhrasePipeline

THRESHOLDS = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.98)
AGREEMENTS = (0, 3, 1)


@torch.no_grad()
def last_states(lm, sequences: list[list[int]], batch_size: int = 8) -> list[torch.Tensor]:
    """The LM's final hidden state ``(L_i, d)`` at every token of each sequence, unit length (right-padded batches)."""
    states = []
    for begin in range(0, len(sequences), batch_size):
        batch = sequences[begin : begin + batch_size]
        width = max(len(ids) for ids in batch)
        ids = torch.tensor([ids + [0] * (width - len(ids)) for ids in batch])
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in batch])
        hidden = F.normalize(lm.model(input_ids=ids, attention_mask=mask).last_hidden_state.float(), dim=-1)
        states += [hidden[i, : len(row)] for i, row in enumerate(batch)]
    return states


def phrase_keys(documents: list[list[int]], states: list[torch.Tensor],
                index: dict[tuple[int, ...], int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every place a plugged-in phrase starts in ``documents`` (after their first token): the state before it
    ``(M, d)`` and the phrase's index ``(M,)``."""
    found = [(states[number][start - 1], index[span]) for number, start, span in phrase_starts(documents, index) if start]
    if not found:
        return torch.zeros(0, states[0].shape[-1]), torch.zeros(0, dtype=torch.long)
    return torch.stack([key for key, _ in found]), torch.tensor([owner for _, owner in found])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--skip", type=int, default=0, help="held-out leads passed over first (200: not the reported)")
    parser.add_argument("--checkpoint", default=str(SHIPPED_ENCODER), help="only the tokenizer and LM are used")
    parser.add_argument("--data", default="wikipedia", choices=("wikipedia", "licenses"))
    parser.add_argument("--max-document-tokens", type=int, default=512)
    parser.add_argument("--output", help="write the figures as JSON here")
    args = parser.parse_args(argv)

    model = load_dynamic_lm("smollm2", args.checkpoint)
    tokenizer, lm = model.tokenizer, model.lm
    config = EvalConfig(model="smollm2", data=args.data, num_prompts=args.skip + args.num_prompts)
    prompts = held_out_prompts(tokenizer, config)[args.skip :]
    pipeline = PhrasePipeline(model, demo_index(Path(".cache/demo"), args.data), PipelineConfig())
    counts = defaultdict(int)
    for item in tqdm(prompts, desc="leads"):
        documents = pipeline.index.search_documents([item["prompt"]], k=pipeline.config.top_k)[0]
        phrases = [tuple(ids) for ids in tokenizer([p.text for p in pipeline.candidates(documents)],
                                                   add_special_tokens=False).input_ids]
        index = {phrase: p for p, phrase in enumerate(phrases)}
        document_ids = [ids[: args.max_document_tokens] for ids in
                        tokenizer([d["text"] for d in documents], add_special_tokens=False).input_ids]
        keys, owners = phrase_keys(document_ids, last_states(lm, document_ids), index)
        prompt_ids = tokenizer(item["prompt"]).input_ids
        reference = tokenizer(item["reference"], add_special_tokens=False).input_ids
        with torch.no_grad():
            hidden = lm.model(input_ids=torch.tensor([prompt_ids + reference])).last_hidden_state[0]
            hidden = hidden[len(prompt_ids) - 1 : -1]  # (T, d): the state before each reference token
            logits = lm.lm_head(hidden).float()
        query = F.normalize(hidden.float(), dim=-1)
        top = logits.topk(max(AGREEMENTS), dim=-1).indices  # (T, k)
        gold = torch.tensor(reference)
        token_right = top[:, 0] == gold
        fits = fitting_phrases(phrases, reference)  # (T, P)
        counts["positions"] += len(reference)
        counts["fits"] += int(fits.any(-1).sum())
        counts["token_right"] += int(token_right.sum())
        if not len(owners):
            for threshold in THRESHOLDS:
                for k in AGREEMENTS:
                    counts[f"{threshold}/k{k}/correct"] += int(token_right.sum())
            continue
        lengths = torch.tensor([len(phrases[p]) for p in owners.tolist()], dtype=torch.float)
        similarity = query @ keys.T - 1e-4 * lengths  # (T, M); of equally close keys, the shortest phrase
        first = torch.tensor([phrases[p][0] for p in owners.tolist()])
        for k in AGREEMENTS:
            allowed = similarity if not k else similarity.masked_fill(
                ~(first[None, :, None] == top[:, None, :k]).any(-1), float("-inf"))
            best, where = allowed.max(-1)  # (T,)
            right = fits.gather(1, owners[where][:, None])[:, 0]
            for threshold in THRESHOLDS:
                wins = best >= threshold
                counts[f"{threshold}/k{k}/wins"] += int(wins.sum())
                counts[f"{threshold}/k{k}/fitting_wins"] += int((wins & right).sum())
                counts[f"{threshold}/k{k}/correct"] += int(torch.where(wins, right, token_right).sum())
    rows = []
    for k in AGREEMENTS:
        for threshold in THRESHOLDS:
            wins, fitting, correct = (counts[f"{threshold}/k{k}/{name}"] for name in ("wins", "fitting_wins", "correct"))
            rows.append({"threshold": threshold, "agreement_top_k": k, "win_rate": wins / counts["positions"],
                         "precision": fitting / wins if wins else 0.0, "recall": fitting / max(counts["fits"], 1),
                         "accuracy": correct / counts["positions"],
                         "against_phrases_off": correct - counts["token_right"]})
    result = {"command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
              "prompts": len(prompts), "skipped": args.skip, "positions": counts["positions"],
              "fit_rate": counts["fits"] / counts["positions"],
              "accuracy_phrases_off": counts["token_right"] / counts["positions"], "rows": rows}
    report(result, f"held-out {args.data} texts",
           ["agreement top k", "threshold", "proposals", "precision", "recall", "accuracy", "positions against phrases off"],
           lambda r: [r["agreement_top_k"] or "off", r["threshold"], f"{100 * r['win_rate']:.2f}%",
                      f"{100 * r['precision']:.1f}%", f"{100 * r['recall']:.1f}%", f"{100 * r['accuracy']:.2f}%",
                      f"{r['against_phrases_off']:+d}"],
           args.output)
    return result


if __name__ == "__main__":
    main()
