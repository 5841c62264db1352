"""Building an index past one process: `dynvocab index --shards` at 1 and N processes, then IVF-PQ against flat.

Passages are windows of ``--words`` words cut from every corpus installed here (the Wikipedia leads and the
licences); where they give fewer than ``--passages``, further rounds of windows shifted by a prime number of words
are cut, so no passage is an exact copy (the report says how many rounds). Each process count runs the real
command (``accelerate launch --multi_gpu --num_processes N -m dynvocab index``) in its own shards folder; the
report gives documents/s of the encoding and of the whole command. The vectors of the last run then build flat,
IVF and IVF-PQ indexes: their bytes, and recall@10 and ms/query against flat over nprobe, on the first sentences
of the held-out Wikipedia leads as queries.

    python examples/benchmark_index_build.py --passages 20000 --processes 1,2           # 2 CPU cores: ~10 min
    python examples/benchmark_index_build.py --passages 1000000 --words 50 --processes 1   # a GPU: 50 rounds of windows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: window shift between rounds of passages: a prime, so rounds do not line up with each other
SHIFT = 37


def cut_passages(count: int, words: int) -> tuple[list[dict[str, str]], int]:
    """``count`` passages of ``words`` words from every corpus here, and the rounds of shifted windows it took."""
    from dynvocab.data.assets import license_texts, wikipedia_leads

    texts = [document["text"].split() for document in wikipedia_leads() + license_texts()]
    passages: list[dict[str, str]] = []
    rounds = 0
    while len(passages) < count and rounds < words:  # after `words` rounds the shifts come round again
        offset = rounds * SHIFT % words
        for tokens in texts:
            for start in range(offset, len(tokens), words):
                if len(tokens[start:start + words]) >= words // 2:
                    passages.append({"id": f"p{len(passages)}", "text": " ".join(tokens[start:start + words])})
        rounds += 1
    return passages[:count], rounds


def run_index(workdir: Path, processes: int, encoder: str) -> dict:
    """One `dynvocab index --shards` run at ``processes`` processes: its processes' reports and wall time."""
    shards, output = workdir / f"shards-{processes}", workdir / f"index-{processes}"
    arguments = ["index", "--data", str(workdir / "passages.jsonl"), "--encoder", encoder, "--index-type", "flat",
                 "--shards", str(shards), "--output", str(output)]
    launcher = ([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
                 "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "dynvocab"]
                if processes > 1 else [sys.executable, "-m", "dynvocab"])
    start = time.perf_counter()
    done = subprocess.run(launcher + arguments, capture_output=True, text=True, env={**os.environ})
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"dynvocab index at {processes} processes failed:\n{done.stderr[-3000:]}")
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"process"')]
    documents = sum(report["documents"] for report in reports)
    encoding = max(report["seconds"] for report in reports)
    return {"processes": processes, "documents": documents, "encoding_s": round(encoding, 1),
            "encoding_docs_per_s": round(documents / encoding, 1), "command_s": round(wall, 1),
            "command_docs_per_s": round(documents / wall, 1), "shards": str(shards), "num_shards": len(reports)}


def compare_indexes(vectors: np.ndarray, queries: np.ndarray, pq_sizes: list[int], k: int = 10) -> list[dict]:
    """Bytes, recall@k against flat and ms/query of flat, IVF and IVF-PQ (at each of ``pq_sizes`` bytes a vector)
    over their nprobe."""
    from retrieval.index.ann import IndexConfig, build_index, exact_search, index_bytes, recall_at_k, set_search_param

    exact_ids = exact_search(vectors, queries, k)[1]
    rows = []
    kinds = [("flat", None), ("ivf", None)] + [("ivfpq", m) for m in pq_sizes]
    for kind, pq_m in kinds:
        index = build_index(vectors, kind, IndexConfig(index_type=kind, pq_m=pq_m))
        nlist = index.nlist if kind != "flat" else 1
        for nprobe in sorted({1, 4, 16, 64, 256, nlist} & set(range(1, nlist + 1))):
            if kind != "flat":
                set_search_param(index, kind, nprobe)
            start = time.perf_counter()
            ids = index.search(queries, k)[1]
            ms = (time.perf_counter() - start) * 1000 / len(queries)
            rows.append({"index": kind, "pq_m": pq_m, "nprobe": nprobe if kind != "flat" else None, "bytes": index_bytes(index),
                         "bytes_per_vector": round(index_bytes(index) / len(vectors), 1),
                         f"recall@{k}": round(recall_at_k(ids, exact_ids), 4), "ms_per_query": round(ms, 3)})
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=20_000)
    parser.add_argument("--words", type=int, default=100, help="words a passage")
    parser.add_argument("--processes", default="1,2", help="process counts to run, comma-separated")
    parser.add_argument("--encoder", default="minilm-wikipedia")
    parser.add_argument("--queries", type=int, default=1000, help="held-out Wikipedia leads' first sentences")
    parser.add_argument("--pq-m", default="48,96,192", help="IVF-PQ bytes a vector to compare (divisors of d)")
    parser.add_argument("--from-shards", type=int, default=None,
                        help="no build: compare the indexes over the shards an earlier run at this many processes left")
    parser.add_argument("--workdir", default=".cache/index-build")
    parser.add_argument("--output", default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)

    import torch

    from dynvocab.data.corpora import corpus_split
    from retrieval.index.documents import load_documents
    from retrieval.index.shards import read_shards
    from retrieval.loading import document_encoder

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    passages, rounds = cut_passages(args.passages, args.words)
    (workdir / "passages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages), encoding="utf-8")
    machine = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"{os.cpu_count()} CPU cores"
    print(f"{len(passages)} passages of {args.words} words ({rounds} rounds of windows shifted by {SHIFT} words) on "
          f"{machine}", flush=True)
    builds = []
    for processes in (int(p) for p in args.processes.split(",")) if args.from_shards is None else ():
        builds.append(run_index(workdir, processes, args.encoder))
        print(json.dumps(builds[-1]), flush=True)
    encoder = document_encoder(args.encoder)
    documents = load_documents(str(workdir / "passages.jsonl"))
    shards = args.from_shards or builds[-1]["num_shards"]
    vectors = read_shards(documents, workdir / f"shards-{shards}", shards, encoder)
    held_out = corpus_split("wikipedia")[1][: args.queries]
    queries = encoder.encode([lead["text"].split(". ")[0] for lead in held_out], show_progress_bar=False)
    indexes = compare_indexes(vectors, np.asarray(queries, dtype=np.float32), [int(m) for m in args.pq_m.split(",")])
    for row in indexes:
        print(json.dumps(row), flush=True)
    report = {"machine": machine, "passages": len(passages), "words": args.words, "rounds": rounds,
              "encoder": args.encoder, "queries": len(held_out), "builds": builds, "indexes": indexes}
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
