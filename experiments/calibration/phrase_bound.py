"""How few steps could any phrase rule take? An oracle bound on the evaluation's prompts (#32, #33, a probe)

For each prompt of an evaluation folder, the fewest decoding steps that write a text when every step emits one token
or one phrase that spells the text there (a shortest path over the text's tokens), with three phrase sets:

- *plugged*: the phrases the pipeline plugs in for the prompt (what any head of the shipped setup chooses from);
- *documents*: every 2-8 token span of the prompt's top-k documents (any phrase extraction from them);
- *corpus*: every 2-8 token span of the whole indexed corpus (a CoG-style phrase table).

It bounds the reference (text a perfect model would write) and each system's continuation (``--systems``). A
second bound reads the bare LM's text as lossless drafting would: a step drafts from n-gram tables (the prompt,
the documents, the corpus) and keeps the longest draft the LM agrees with, plus the LM's own next token.
``--step-cost`` times the LM's forward over 1 and over ``--draft-tokens`` new tokens after the prompt, the cost of
such a step here.

``--state-thresholds`` adds a drafter that finds its place by the LM's state, not by matching tokens: at each step,
the document position (of the top-k documents) whose state is closest to the LM's state over the text so far, if
their cosine reaches the threshold, proposes the tokens that followed it there (the keys of ``dynvocab.states.keys`` at
every position, read from the states kept beside the index, ``dynvocab document-states``). After the text's first
disagreement with a document it shares no tokens with it for a while, and the n-gram tables propose nothing; the
state may still point back into it. Reported alone and beside the n-gram tables, with how often it proposed and kept.

    python experiments/calibration/phrase_bound.py --run results/wikipedia/greedy-h200 --systems bare,bare:no_repeat=4 \
        --step-cost --output results/drafting/phrase-bound/wikipedia.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

Spans = set[tuple[int, ...]]


def spans(documents: Iterable[Sequence[int]], lengths: range = range(2, 9)) -> Spans:
    """Every span of ``lengths`` tokens in ``documents``."""
    return {tuple(ids[i : i + n]) for ids in documents for n in lengths for i in range(len(ids) - n + 1)}


def fewest_steps(ids: Sequence[int], phrases: Spans, longest: int = 8) -> int:
    """The fewest items (tokens, or ``phrases`` that spell ``ids`` where they stand) that write ``ids``."""
    best = [0] * (len(ids) + 1)
    for i in range(len(ids) - 1, -1, -1):
        best[i] = best[i + 1] + 1
        for n in range(2, min(longest, len(ids) - i) + 1):
            if tuple(ids[i : i + n]) in phrases:
                best[i] = min(best[i], best[i + n] + 1)
    return best[0]


def continuations(documents: Iterable[Sequence[int]], context: int, draft: int) -> dict[tuple[int, ...], Counter]:
    """``context`` tokens -> how often each following ``draft`` tokens follow them in ``documents``."""
    table: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for ids in documents:
        for i in range(context, len(ids)):
            table[tuple(ids[i - context : i])][tuple(ids[i : i + draft])] += 1
    return table


def drafted_steps(prompt: Sequence[int], text: Sequence[int], tables: list[dict[int, dict]], draft: int,
                  by_state: Sequence[tuple[int, ...]] | None = None) -> Counter:
    """Steps of lossless drafting over ``text``: each step keeps the longest agreeing draft among ``tables`` (each
    proposes its most frequent continuation of the longest context it knows; the text so far counts as one more
    table, prompt-lookup style; ``tables=None``: no n-gram table at all) and ``by_state[t]`` (the state drafter's
    proposal at prompt-and-text position ``t``), and adds the LM's own next token. Counts ``steps``, and the steps
    the state drafter ``proposed`` at and ``kept`` a token at."""
    ids, t, counts = list(prompt) + list(text), len(prompt), Counter()
    while t < len(ids):
        kept = 0
        so_far = {n: continuations([ids[:t]], n, draft) for n in (1, 2, 3)}
        for table in [*tables, so_far] if tables is not None else []:
            kept = max(kept, _agreement(_proposal(table, ids[:t]), ids, t))
        if by_state is not None and by_state[t]:
            agree = _agreement(by_state[t], ids, t)
            counts["proposed"] += 1
            counts["kept"] += agree > 0
            kept = max(kept, agree)
        t += kept + 1
        counts["steps"] += 1
    return counts


def _agreement(proposal: Sequence[int], ids: Sequence[int], t: int) -> int:
    """How many of ``proposal``'s tokens the text ``ids`` goes on with from position ``t``."""
    agree = 0
    while agree < len(proposal) and t + agree < len(ids) and proposal[agree] == ids[t + agree]:
        agree += 1
    return agree


def state_proposals(text_states: torch.Tensor, keys: torch.Tensor, followers: list[tuple[int, ...]],
                    threshold: float) -> list[tuple[int, ...]]:
    """For each position ``t`` of prompt and text, what follows the document position whose state (``keys``: the
    state before it, normed) is closest to the text's state before ``t`` (``text_states[t - 1]``), if their cosine
    reaches ``threshold``; else ()."""
    best, where = (F.normalize(text_states, dim=-1) @ keys.T).max(-1)
    return [()] + [followers[int(w)] if float(b) >= threshold else () for b, w in zip(best.tolist(), where.tolist())]


def _proposal(table: dict[int, dict], ids: Sequence[int]) -> tuple[int, ...]:
    for n in sorted(table, reverse=True):
        found = table[n].get(tuple(ids[-n:])) if len(ids) >= n else None
        if found:
            return found.most_common(1)[0][0]
    return ()


def step_cost(model, draft: int, prompt_tokens: int = 100, repeats: int = 15) -> dict[str, float]:
    """Median ms of the LM's forward over 1 and over ``draft`` new tokens after ``prompt_tokens`` cached ones."""
    from dynvocab.decoding.verification import forward_seconds

    seconds = forward_seconds(model, (1, draft), context_tokens=prompt_tokens, repeats=repeats)
    return {f"forward over {n} (ms)": 1000 * s for n, s in seconds.items()}


def candidates(pipeline, documents: list[dict], extraction: str) -> list:
    """The pipeline's phrases of ``documents``, or those of its extractor with its stopword or sentence rule off."""
    if extraction == "pipeline":
        return pipeline.candidates(documents)
    from retrieval.phrases import ENGLISH_STOPWORDS, extract_phrases, tokenized_phrases

    c, table = pipeline.config, pipeline.model.phrase_table
    stopwords = None if extraction in ("stopwords", "both") else ENGLISH_STOPWORDS
    found = extract_phrases(documents, pipeline.model.tokenizer, unit=c.unit, min_length=c.min_length,
                            max_length=c.max_length, max_phrases=c.max_phrases + c.max_phrases // 8 + 8, edges=c.edges,
                            ranking=c.ranking, stopwords=stopwords,
                            split_sentences=extraction not in ("sentences", "both"))
    return [phrase for phrase, _ in tokenized_phrases(found, pipeline.model.tokenizer, table.max_phrase_tokens,
                                                      table.tokenize)][: c.max_phrases]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="an evaluation folder with generations.jsonl")
    parser.add_argument("--systems", default="bare", help="comma-separated systems of the folder to bound as well")
    parser.add_argument("--data", default="wikipedia", choices=("wikipedia", "licenses"))
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--edges", default="content", choices=("content", "any"), help="the plugged phrases' edges")
    parser.add_argument("--max-phrases", type=int, default=2048, help="plugged phrases per prompt")
    parser.add_argument("--extraction", default="pipeline", choices=("pipeline", "stopwords", "sentences", "both"),
                        help="the pipeline's extractor, or one that also keeps phrases made only of stopwords, lets "
                             "phrases cross sentence ends, or both")
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--step-cost", action="store_true", help="time the LM's forward over 1 and over the draft")
    parser.add_argument("--state-thresholds", default="",
                        help="comma-separated cosines: also draft by the LM's state (the index's document states)")
    parser.add_argument("--output", required=True, help="a .json file for the figures")
    args = parser.parse_args()

    from dynvocab.data.corpora import corpus_split
    from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
    from dynvocab.states.store import DocumentStates
    from retrieval.config import PipelineConfig
    from retrieval.document_states import attach_document_states, document_token_ids
    from retrieval.loading import demo_index
    from retrieval.pipeline import PhrasePipeline

    torch.manual_seed(0)
    model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    tokenizer = model.tokenizer
    config = PipelineConfig(top_k=args.top_k, edges=args.edges, max_phrases=args.max_phrases)
    pipeline = PhrasePipeline(model, demo_index(Path(".cache/demo"), args.data), config)
    corpus = tokenizer([d["text"] for d in corpus_split(args.data)[0]], add_special_tokens=False).input_ids
    corpus_spans = spans(corpus)
    corpus_tables = {n: continuations(corpus, n, args.draft_tokens) for n in (1, 2, 3, 4)}
    thresholds = [float(t) for t in args.state_thresholds.split(",") if t]
    if thresholds:
        document_states = DocumentStates(model.lm)
        attach_document_states(document_states, pipeline.index)  # the states kept beside the index, where it has them
        text_states = DocumentStates(model.lm, max_tokens=4096, max_bytes=0)
    proposals: Counter = Counter()
    rows = [json.loads(line) for line in Path(args.run, "generations.jsonl").read_text().splitlines()]
    systems = args.systems.split(",")
    texts = {(row["id"], row["system"]): row["text"] for row in rows if row["system"] in systems}
    prompts = {row["id"]: row for row in rows}
    tokens: Counter = Counter()
    steps: Counter = Counter()
    for key, row in tqdm(prompts.items(), desc="prompts"):
        documents = pipeline.index.search_documents([row["prompt"]], k=args.top_k)[0]
        plugged = set(model.phrase_table.tokenize([p.text for p in candidates(pipeline, documents, args.extraction)]))
        document_ids = document_token_ids(tokenizer, documents)
        sets = {"plugged": plugged, "documents": spans(document_ids), "corpus": corpus_spans}
        prompt_ids = tokenizer(row["prompt"]).input_ids
        document_tables = {n: continuations(document_ids, n, args.draft_tokens) for n in (1, 2, 3, 4)}
        prompt_tables = {n: continuations([prompt_ids], n, args.draft_tokens) for n in (1, 2, 3)}
        if thresholds:
            cut = [ids[: document_states.max_tokens] for ids in document_ids if len(ids) > 1]
            keys = F.normalize(torch.cat([states[:-1] for states in document_states(cut)]), dim=-1)
            followers = [tuple(ids[p : p + args.draft_tokens]) for ids in cut for p in range(1, len(ids))]
        for name in ["(reference)", *systems]:
            text = row["reference"] if name == "(reference)" else texts.get((key, name))
            if text is None:
                continue
            ids = tokenizer(text, add_special_tokens=False).input_ids
            tokens[name] += len(ids)
            for kind, phrases in sets.items():
                steps[name, kind] += fewest_steps(ids, phrases)
            if name != "(reference)":
                for kind, tables in {"drafts from prompt and text": [prompt_tables],
                                     "drafts from documents too": [prompt_tables, document_tables],
                                     "drafts from corpus too": [prompt_tables, document_tables, corpus_tables]}.items():
                    steps[name, kind] += drafted_steps(prompt_ids, ids, tables, args.draft_tokens)["steps"]
                if thresholds:
                    states = text_states([prompt_ids + ids])[0]
                for threshold in thresholds:
                    by_state = state_proposals(states, keys, followers, threshold)
                    for kind, tables in {f"drafts by state >= {threshold} alone": None,
                                         f"drafts from documents and by state >= {threshold}":
                                             [prompt_tables, document_tables]}.items():
                        counts = drafted_steps(prompt_ids, ids, tables, args.draft_tokens, by_state)
                        steps[name, kind] += counts["steps"]
                        proposals[name, kind, "proposed"] += counts["proposed"]
                        proposals[name, kind, "kept a token"] += counts["kept"]
    figures = {name: {kind: steps[key] / tokens[name] for key in steps if key[0] == name for kind in [key[1]]}
               for name in tokens}
    result = {"run": args.run, "prompts": len(prompts), "top_k": args.top_k, "draft_tokens": args.draft_tokens,
              "tokens": dict(tokens), "steps_per_token": figures}
    if thresholds:
        result["state_drafter_steps"] = {" / ".join(key): count for key, count in proposals.items()}
    if args.step_cost:
        result["step_cost"] = step_cost(model.lm, args.draft_tokens)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
