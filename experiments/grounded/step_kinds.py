"""What a grounded decoding step proposes and keeps: the steps with nothing to propose, the drafts that follow the
LM's own token, and the proposals read back whole (a vouched draft or phrase), with how far each kind is kept.

    python experiments/grounded/step_kinds.py --data wikipedia --skip_prompts 200 --num_prompts 24 OUT

Generates ``--system`` over the eval's held-out prompts (``dynvocab eval``'s settings, the report's guard and
documents) into OUT and counts every step's proposal, listening to each row's verification. A bound on what
drafting can save: the tokens a call keeps, and the share of calls that read nothing beyond the LM's own token.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from dynvocab.decoding import verification
from evals.protocol import EvalConfig, generate_all


def listen(steps: list[tuple[int, int, int]]) -> None:
    """Record ``(tokens read back, LM's own tokens among them, tokens kept)`` for every verified step (a patch of the
    row's ``verify``: the decoding itself is unchanged)."""
    verify = verification._RowDecoding.verify

    def heard(row, logits):
        tokens, _, _, own, _ = row.step
        kept = verify(row, logits)
        steps.append((len(tokens), own, kept))
        return kept

    verification._RowDecoding.verify = heard


def reach(proposals: list[tuple[int, int]]) -> str:
    """P(at least j tokens of a proposal kept), j = 1..8, over ``(proposed, kept)``."""
    return ", ".join(f"{j}: {sum(kept >= j for _, kept in proposals) / len(proposals):.3f}" for j in range(1, 9))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir")
    parser.add_argument("--data", default="wikipedia")
    parser.add_argument("--system", default="grounded")
    parser.add_argument("--skip_prompts", type=int, default=200)
    parser.add_argument("--num_prompts", type=int, default=24)
    parser.add_argument("--windows_per_document", type=int, default=1)
    args = parser.parse_args()
    steps: list[tuple[int, int, int]] = []
    listen(steps)
    generate_all(EvalConfig(data=args.data, systems=args.system, skip_prompts=args.skip_prompts,
                            num_prompts=args.num_prompts, windows_per_document=args.windows_per_document,
                            latency_prompts=0, rag_documents=2, rag_document_tokens=384, no_repeat_ngram_size=4,
                            mauve_permutations=0, output_dir=args.output_dir))
    (Path(args.output_dir) / "steps.json").write_text(json.dumps(steps) + "\n")
    kinds = collections.Counter("nothing proposed" if read == own else "after the LM's token" if own else "read whole"
                                for read, own, _ in steps)
    print(f"{args.system} on {args.data}: {len(steps)} LM calls, {sum(k for *_, k in steps) / len(steps):.2f} tokens "
          "kept a call")
    for kind, count in kinds.most_common():
        print(f"  {kind}: {count} calls ({count / len(steps):.1%})")
    after = [(read - 1, kept - 1) for read, own, kept in steps if own and read > 1]
    whole = [(read, kept) for read, own, kept in steps if not own]
    if after:
        print(f"  a draft after the LM's token ({sum(r for r, _ in after) / len(after):.1f} tokens): at least j of it "
              f"kept: {reach(after)}")
    if whole:
        print(f"  read whole ({sum(r for r, _ in whole) / len(whole):.1f} tokens, the first vouched): at least j kept: "
              f"{reach(whole)}")


if __name__ == "__main__":
    main()
