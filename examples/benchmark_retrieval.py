"""Benchmark retrieval on the offline Wikipedia leads with all-MiniLM-L6-v2, on 2 CPU threads.

Reports: time to encode and index the corpus; top-k search ms/query on flat, IVF and
HNSW; recall@k of IVF and HNSW against flat on FanOutQA questions; phrase extraction
ms per 32 retrieved documents with the GPT-2 and SmolLM2 tokenizers.

    python examples/benchmark_retrieval.py            # tiny smoke run (seconds)
    python examples/benchmark_retrieval.py --full     # all 10,033 leads, 310 questions (2-4 min on 2 cores)
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from dataclasses import dataclass, field


@dataclass
class BenchmarkConfig:
    """Sizes and settings of one benchmark run."""

    num_docs: int = field(default=512, metadata={"help": "Wikipedia leads to index (0: all 10,033)"})
    num_queries: int = field(default=32, metadata={"help": "FanOutQA dev questions used as queries (max 310)"})
    k: int = field(default=32, metadata={"help": "documents retrieved per query"})
    threads: int = field(default=2, metadata={"help": "CPU threads for torch, faiss and tokenizers"})
    batch_size: int = field(default=64, metadata={"help": "encoding batch size"})
    phrase_batches: int = field(default=10, metadata={"help": "queries whose top-k documents feed phrase timing"})
    smollm2: bool = field(default=True, metadata={"help": "also time phrase extraction with SmolLM2's tokenizer"})
    fp32: bool = field(default=False, metadata={"help": "encode in exact fp32 instead of the precision policy (bf16 "
                                                        "autocast only where the CPU computes bf16 natively)"})

    def __post_init__(self) -> None:
        for name in ("num_queries", "k", "threads", "batch_size", "phrase_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.num_docs < 0:
            raise ValueError(f"num_docs={self.num_docs} must be >= 0 (0 means all)")


FULL = {"num_docs": 0, "num_queries": 310, "phrase_batches": 50}


def parse_args(argv: list[str] | None) -> BenchmarkConfig:
    from transformers import HfArgumentParser

    parser = HfArgumentParser(BenchmarkConfig, description=__doc__.split("\n\n")[0])
    for action in parser._actions:
        if action.dest in FULL:
            action.help += f" (--full: {FULL[action.dest]})"
    parser.add_argument("--full", action="store_true", help="the full run: every lead, every question")
    parser.add_argument("--verbose", action="store_true", help="log progress (and show encoding progress bars)")
    # a flag left out keeps this marker (argparse fills in defaults only where the namespace has none), so --full can tell
    unset = object()
    args = vars(parser.parse_args(argv, namespace=argparse.Namespace(**dict.fromkeys(FULL, unset))))
    full, verbose = args.pop("full"), args.pop("verbose")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")
    given = {name: value for name, value in args.items() if value is not unset}
    return BenchmarkConfig(**{**(FULL if full else {}), **given})


def per_query_ms(search, queries, k: int) -> float:
    """Mean latency of single-query searches, in ms (after one warm-up)."""
    search(queries[:1], k)
    start = time.perf_counter()
    for i in range(len(queries)):
        search(queries[i : i + 1], k)
    return (time.perf_counter() - start) * 1000 / len(queries)


def time_phrases(batches, tokenizer, seen: bool, repeats: int = 3) -> tuple[list[float], list[float], int]:
    """Wall and CPU milliseconds of ``extract_phrases`` per batch (best of ``repeats``), and phrases in the last:
    each batch's documents cut afresh, or, with ``seen``, documents it cut before (``extract_phrases`` keeps each
    document's n-grams)."""
    from retrieval.phrases import extract_phrases, forget_cut_documents

    extract_phrases(batches[0], tokenizer)  # warm-up
    walls, cpus, count = [], [], 0
    for documents in batches:
        best_wall = best_cpu = float("inf")
        for _ in range(repeats):
            if not seen:
                forget_cut_documents()
            wall, cpu = time.perf_counter(), time.process_time()
            count = len(extract_phrases(documents, tokenizer))
            best_wall = min(best_wall, time.perf_counter() - wall)
            best_cpu = min(best_cpu, time.process_time() - cpu)
        walls.append(best_wall * 1000)
        cpus.append(best_cpu * 1000)
    return walls, cpus, count


def main(argv: list[str] | None = None) -> dict[str, float]:
    config = parse_args(argv)
    os.environ.setdefault("RAYON_NUM_THREADS", str(config.threads))  # tokenizers' thread pool, read on first use

    import faiss
    import torch
    from transformers import AutoTokenizer, GPT2TokenizerFast

    from dynvocab.data.assets import fanoutqa_dev, gpt2_tokenizer_dir, minilm_dir, smollm2_dir, wikipedia_leads
    from dynvocab.hardware.precision import encode_autocast_dtype
    from encoders import DenseEncoder
    from retrieval import DocumentIndex

    torch.set_num_threads(config.threads)
    faiss.omp_set_num_threads(config.threads)
    leads = wikipedia_leads()
    documents = leads[: config.num_docs] if config.num_docs else leads
    questions = [item["question"] for item in fanoutqa_dev()][: config.num_queries]
    k = min(config.k, len(documents))
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
          "(other jobs slow every figure)")
    amp = None if config.fp32 else encode_autocast_dtype("auto", torch.device("cpu"))
    print(f"{len(documents)} Wikipedia leads, {len(questions)} FanOutQA questions, k={k}, "
          f"{config.threads} threads, encoder {'bf16 autocast' if amp else 'fp32'}, "
          f"faiss {faiss.__version__}, torch {torch.__version__}")
    results: dict[str, float] = {}

    encoder = DenseEncoder(str(minilm_dir()), amp_dtype=amp)
    start, cpu = time.perf_counter(), time.process_time()
    vectors = encoder.encode([d["text"] for d in documents], batch_size=config.batch_size)
    results["encode_s"] = time.perf_counter() - start
    results["encode_cpu_s"] = time.process_time() - cpu
    indexes = {}
    for kind in ("flat", "ivf", "hnsw"):
        start = time.perf_counter()
        indexes[kind] = DocumentIndex.build(documents, encoder, vectors=vectors, index_type=kind)
        results[f"build_{kind}_s"] = time.perf_counter() - start
    print(f"encode {len(documents)} docs: {results['encode_s']:.1f} s ({len(documents) / results['encode_s']:.0f}/s, "
          f"{results['encode_cpu_s']:.0f} CPU-s); "
          f"build flat {results['build_flat_s']:.2f} s, ivf {results['build_ivf_s']:.2f} s "
          f"(nlist={indexes['ivf']._cpu_index.nlist}, tuned nprobe={indexes['ivf'].search_param}), "
          f"hnsw {results['build_hnsw_s']:.2f} s (tuned efSearch={indexes['hnsw'].search_param})")
    total = results["encode_s"] + max(results[f"build_{kind}_s"] for kind in indexes)
    print(f"  encode + index: {total:.1f} s  (target <= 180 s for all 10,033 leads)")

    start = time.perf_counter()
    query_vectors = encoder.encode(questions, batch_size=config.batch_size)
    results["encode_query_ms"] = (time.perf_counter() - start) * 1000 / len(questions)
    results["encode_one_query_ms"] = per_query_ms(lambda q, _: encoder.encode(q), questions[:20], k)
    print(f"query encoding: {results['encode_query_ms']:.2f} ms/query batched, "
          f"{results['encode_one_query_ms']:.2f} ms one at a time")
    for kind, index in indexes.items():
        results[f"search_{kind}_ms"] = per_query_ms(index.search, query_vectors, k)
    for kind in ("ivf", "hnsw"):
        results[f"recall_{kind}"] = indexes[kind].recall(query_vectors, k)
    print(f"top-{k} search ms/query (vectors, one at a time): "
          + ", ".join(f"{kind} {results[f'search_{kind}_ms']:.3f}" for kind in indexes) + "  (target <= 10 ms)")
    print(f"recall@{k} against flat, tuned on documents: "
          + ", ".join(f"{kind} {results[f'recall_{kind}']:.4f} ({indexes[kind].search_param})"
                      for kind in ("ivf", "hnsw"))
          + "  (target >= 0.95)")
    half = len(query_vectors) // 2
    if half >= 1:
        for kind in ("ivf", "hnsw"):
            indexes[kind].tune(query_vectors[:half], k=k)
            results[f"recall_{kind}_query_tuned"] = indexes[kind].recall(query_vectors[half:], k)
            results[f"search_{kind}_query_tuned_ms"] = per_query_ms(indexes[kind].search, query_vectors, k)
        print(f"recall@{k} against flat, tuned on {half} questions, measured on the other {len(query_vectors) - half}: "
              + ", ".join(f"{kind} {results[f'recall_{kind}_query_tuned']:.4f} ({indexes[kind].search_param}, "
                          f"{results[f'search_{kind}_query_tuned_ms']:.3f} ms/query)" for kind in ("ivf", "hnsw")))

    batches = indexes["flat"].search_documents(questions[: config.phrase_batches], k)
    tokenizers = {"gpt2": GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir())}
    if config.smollm2:
        tokenizers["smollm2"] = AutoTokenizer.from_pretrained(smollm2_dir())
    for name, tokenizer in tokenizers.items():
        for seen, key, what in ((False, f"phrases_{name}_ms", "cut afresh"), (True, f"phrases_{name}_seen_ms", "cut before")):
            times, cpus, count = time_phrases(batches, tokenizer, seen)
            results[key] = statistics.median(times)
            print(f"phrase extraction ({name} tokenizer), {k} retrieved docs {what}: median {statistics.median(times):.1f} "
                  f"ms, min {min(times):.1f}, max {max(times):.1f} over {len(times)} queries (CPU time median "
                  f"{statistics.median(cpus):.1f} ms); {count} phrases in the last  (target <= 30 ms)")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return results


if __name__ == "__main__":
    main()
