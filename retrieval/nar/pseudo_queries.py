"""Pseudo-queries: the search queries an instruction-tuned LM writes for each document, PIXAR's docids.

PIXAR (as MINDER before it) identifies a passage by the queries a pre-trained LM generates from it, and trains on
real queries mapped to them plus each pseudo-query mapped to the passage's others. ``write_pseudo_queries`` samples
``per_document`` queries a document through the tokenizer's chat template, left-padded batches, and appends one JSON
line a document (``{"document": i, "id", "queries": [...]}``), so a stopped run resumes at the first document
missing. ``read_pseudo_queries`` gives them back in document order.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dynvocab.io.jsonl import iter_jsonl

logger = logging.getLogger(__name__)

INSTRUCTION = "Write one short search query that the passage below answers. Reply with the query alone.\n\nPassage: "
_LEADING = re.compile(r"^(query|search query|q)\s*[:\-]\s*", re.IGNORECASE)


def clean_query(text: str) -> str:
    """The first line of what the LM wrote, without a "Query:" label or quotes; "" when nothing is left."""
    line = text.strip().split("\n")[0].strip()
    return _LEADING.sub("", line).strip().strip("\"'").strip()


def prompt_ids(tokenizer, text: str, words: int) -> list[int]:
    """The instruction and the document's first ``words`` words, through the chat template when there is one."""
    content = INSTRUCTION + " ".join(text.split()[:words])
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    return tokenizer(content + "\nQuery:", add_special_tokens=True)["input_ids"]


@torch.no_grad()
def generate_pseudo_queries(lm, tokenizer, texts: Sequence[str], per_document: int = 4, max_new_tokens: int = 24,
                            words: int = 128, temperature: float = 0.8, top_p: float = 0.95) -> list[list[str]]:
    """Up to ``per_document`` distinct sampled queries for each of ``texts`` (one left-padded batch)."""
    from dynvocab.tokens.padding import pad_id

    prompts = [prompt_ids(tokenizer, text, words) for text in texts]
    width = max(map(len, prompts))
    pad = pad_id(tokenizer)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=lm.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=lm.device)
    out = lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_p=top_p,
                      max_new_tokens=max_new_tokens, num_return_sequences=per_document, pad_token_id=pad)
    written = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    queries = []
    for row in range(len(texts)):
        found = [clean_query(text) for text in written[row * per_document : (row + 1) * per_document]]
        queries.append(list(dict.fromkeys(q for q in found if len(q.split()) >= 2)))
    return queries


def write_pseudo_queries(lm, tokenizer, documents: Sequence[dict], path: str | Path, per_document: int = 4,
                         batch_size: int = 32, seed: int = 0, show_progress_bar: bool | None = None,
                         **settings) -> int:
    """Append the pseudo-queries of every document not yet in the JSONL file ``path``; returns how many it wrote.

    ``settings`` go to ``generate_pseudo_queries``. Each batch is seeded by ``seed`` and its first document and
    written in one piece, so a run resumed with the same batch size writes what an uninterrupted one would.
    """
    path = Path(path)
    done = len(read_pseudo_queries(path, documents)) if path.exists() else 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as file:
        for start in tqdm(range(done, len(documents), batch_size), desc="pseudo-queries", disable=show_progress_bar is False):
            batch = documents[start : start + batch_size]
            torch.manual_seed(seed * 1_000_003 + start)
            found = generate_pseudo_queries(lm, tokenizer, [d["text"] for d in batch], per_document, **settings)
            file.write("".join(json.dumps({"document": start + offset, "id": document.get("id"), "queries": queries},
                                          ensure_ascii=False) + "\n"
                               for offset, (document, queries) in enumerate(zip(batch, found))))  # a batch at once
            file.flush()
    return len(documents) - done


def read_pseudo_queries(path: str | Path, documents: Sequence[dict] | None = None) -> list[list[str]]:
    """Each document's pseudo-queries, in document order, from a file ``write_pseudo_queries`` wrote.

    With ``documents``, ``ValueError`` when a line names another document than the one at its place (the file was
    written for another corpus). A half-written last line (a killed run) is dropped.
    """
    queries: list[list[str]] = []
    for number, record in iter_jsonl(path, fix="delete the file and run again", drop_cut_last_line=True):
        if record.get("document") != len(queries):
            raise ValueError(f"{path}:{number} is document {record.get('document')}, expected {len(queries)}: the "
                             "file is out of order; delete it and run again")
        if documents is not None and (len(queries) >= len(documents)
                                      or record.get("id") != documents[len(queries)].get("id")):
            raise ValueError(f"{path}:{number} was written for another corpus (document id {record.get('id')!r}); "
                             "pass another --output, or delete the file")
        queries.append(list(record["queries"]))
    return queries
