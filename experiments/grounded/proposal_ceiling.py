"""How many tokens an LM call could keep if several proposals were verified together: the ceiling of a token tree.

At gamma = 1 grounded decoding writes the LM's own greedy text, whatever is proposed, so a proposal made at any point
keeps exactly its common prefix with the text that follows. That makes the gain of verifying several proposals in one
forward (a token tree) computable offline from a report's generations, with no LM call: each step keeps the longest
prefix among the proposals, and the forward reads every distinct node of their tree.

Three ways to propose, each judged on the same texts:

- *one proposal*: today's rule (``DocumentDrafter`` picks one source by the tokens its drafts kept so far);
- *every proposal*: all of the drafter's sources at once (the text and the documents read, each after the text's last
  3 and 2 tokens), before and after the LM's own next token;
- *+ corpus top-k*: those and, REST-style, the k most frequent continuations of the text's last 3 (else 2) tokens
  across every indexed training document.

The phrase head's proposals need the LM and are left out. Each policy's time per token is priced by forward calls
over 1 to 32 new tokens after an 800-token context, timed here (``forward_seconds``), so run it with nothing else on
the machine.

    python experiments/grounded/proposal_ceiling.py results/grounded/wikipedia results/grounded/licenses
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np
import torch

from dynvocab.data.corpora import corpus_split
from dynvocab.decoding.drafting import DocumentDrafter
from dynvocab.decoding.verification import forward_seconds
from dynvocab.loading import load_lm
from retrieval.loading import demo_index

WIDTHS = (1, 2, 4, 8, 16, 32)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def tree_nodes(proposals: list[list[int]]) -> int:
    """The distinct prefixes of ``proposals``: the tokens one forward over their token tree reads."""
    return len({tuple(p[:j]) for p in proposals for j in range(1, len(p) + 1)})


def every_draft(drafter: DocumentDrafter, ids: list[int]) -> list[list[int]]:
    """Every source's draft after ``ids``, each distinct one once (``DocumentDrafter.draft`` keeps the one expected to
    keep most)."""
    drafts = [draft for _, draft in drafter.proposals(ids)]
    return [draft for j, draft in enumerate(drafts) if draft not in drafts[:j]]


class CorpusDrafts:
    """REST-style drafts: the most frequent ``length``-token continuations of a 3- (else 2-) token context in
    ``documents``."""

    def __init__(self, documents: list[list[int]], length: int = 8) -> None:
        self.followers = {n: collections.defaultdict(collections.Counter) for n in (3, 2)}
        for ids in documents:
            for end in range(2, len(ids)):
                for n, table in self.followers.items():
                    if end >= n:
                        table[tuple(ids[end - n : end])][tuple(ids[end : end + length])] += 1

    def __call__(self, ids: list[int], k: int) -> list[list[int]]:
        for n, table in self.followers.items():
            if (found := table.get(tuple(ids[-n:]))) is not None:
                return [list(draft) for draft, _ in found.most_common(k)]
        return []


def replay(prompt: list[int], text: list[int], documents: list[list[int]], policy: str, step_cost: float,
           corpus: CorpusDrafts | None, k: int) -> tuple[int, list[int]]:
    """The LM calls writing ``text`` after ``prompt`` took under ``policy``, and the tokens each call read."""
    drafter = DocumentDrafter(documents, 8, no_repeat_ngram_size=4, step_cost=step_cost if policy == "one" else 0.0)
    done, widths = 0, []
    while done < len(text):
        ids, own, rest = prompt + text[:done], text[done], text[done:]
        if policy == "one":  # verification._grounded_proposal at gamma = 1, without the phrase head
            draft = drafter.draft(ids)
            if draft and draft[0] == own:
                kept, width = common_prefix(draft, rest), len(draft)
            else:
                after = drafter.draft(ids + [own])
                kept, width = 1 + common_prefix(after, rest[1:]), 1 + len(after)
        else:
            def extra(at: list[int]) -> list[list[int]]:
                return [drafter._unrepeated(at, d) for d in corpus(at, k)] if corpus is not None and k else []

            proposals = [d for d in every_draft(drafter, ids) + extra(ids) if d and d[0] == own]
            proposals += [[own] + d for d in every_draft(drafter, ids + [own]) + extra(ids + [own])]
            proposals = proposals or [[own]]
            kept, width = max(common_prefix(p, rest) for p in proposals), tree_nodes(proposals)
        done += max(kept, 1)
        widths.append(width)
    return len(widths), widths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="eval output folders with generations.jsonl and eval_config.json")
    parser.add_argument("--system", default="grounded:gamma=1", help="a lossless system of the reports")
    parser.add_argument("--corpus_k", default="1,4", help="corpus drafts per context to try")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm, tokenizer = load_lm("smollm2")
    with torch.no_grad():
        seconds = forward_seconds(lm, WIDTHS, context_tokens=800, repeats=7)
    print("a forward over n new tokens after 800: " + ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in seconds.items()))

    def price(width: int) -> float:
        return float(np.interp(width, WIDTHS, [seconds[n] for n in WIDTHS]))

    step_cost = price(9) / price(1) - 1  # a token and an 8-token draft, as draft_step_cost prices it
    for folder in map(Path, args.reports):
        config = json.loads((folder / "eval_config.json").read_text())
        index = demo_index(Path(".cache/demo"), config["data"], config["encoder"])
        rows = [r for line in (folder / "generations.jsonl").open() if (r := json.loads(line))["system"] == args.system]
        tokenize = lambda texts: tokenizer(texts, add_special_tokens=False).input_ids  # noqa: E731
        cases = [(tokenize(r["prompt"]), tokenize(r["text"]),
                  tokenize([d["text"] for d in index.search_documents([r["prompt"]], k=config["rag_documents"])[0]]))
                 for r in rows]
        corpus = CorpusDrafts(tokenize([d["text"] for d in corpus_split(config["data"])[0]]))
        policies = [("one proposal (today)", "one", 0), ("every proposal", "every", 0)]
        policies += [(f"+ corpus top-{k}", "every", int(k)) for k in args.corpus_k.split(",")]
        print(f"\n{folder} ({len(rows)} prompts, {args.system}'s text)")
        base = None
        for name, policy, k in policies:
            calls, widths, tokens = 0, [], 0
            for prompt, text, documents in cases:
                n, w = replay(prompt, text, documents, policy, step_cost, corpus, k)
                calls, widths, tokens = calls + n, widths + w, tokens + len(text)
            per_token = sum(map(price, widths)) / tokens
            base = base or per_token
            print(f"  {name}: {tokens / calls:.2f} tokens per call, {np.mean(widths):.1f} tokens read per call, "
                  f"{per_token * 1e3:.1f} ms per token on this machine ({per_token / base:.2f}x today's)")


if __name__ == "__main__":
    main()
