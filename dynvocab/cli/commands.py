"""The ``dynvocab`` command line: train, cache-states, train-mwt, index, generate, eval, demo, pretrain-encoder,
finetune-encoder, soup-encoders, extract-adapter, eval-retrieval, build-vocab, pseudo-queries, nar-train, nar-search, qa,
eval-qa, serve, phrase-vectors, document-states, document-kv."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

from ..data.assets import DEFAULT_RETRIEVER, ENCODER_HELP

logger = logging.getLogger("dynvocab")


def dataclass_from_args(cls, args: argparse.Namespace):
    """The ``cls`` config from the flags ``HfArgumentParser`` added for its fields."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})


def cmd_train(args: argparse.Namespace) -> None:
    from ..training.config import TrainConfig
    from ..training.trainer import Trainer

    config = dataclass_from_args(TrainConfig, args)
    final = Trainer(config).train(resume=args.resume)
    print(json.dumps({"output_dir": config.output_dir, **final}))


def cmd_cache_states(args: argparse.Namespace) -> None:
    from ..training.config import TrainConfig
    from ..training.corpus import training_texts
    from ..training.trainer import build_model, open_state_cache

    config = TrainConfig(model=args.model, data=args.data, text_field=args.text_field, held_out=args.held_out,
                         max_length=args.max_length, mode="frozen", readback="tokens")
    texts = list(training_texts(config))
    cache = open_state_cache(config, build_model(config), texts, Path(args.output_dir), args.batch_size, args.shard_chunks)
    print(json.dumps({"state_cache": args.output_dir, "chunks": len(cache), "positions": int(cache.tokens.shape[0]),
                      "train_with": f"dynvocab train --state-cache {args.output_dir} --max-length {args.max_length}"}))


def cmd_train_mwt(args: argparse.Namespace) -> None:
    from ..training.multiword import MultiWordTrainConfig, train_multiword

    config = dataclass_from_args(MultiWordTrainConfig, args)
    _, log = train_multiword(config, resume=args.resume)
    print(json.dumps({"output_dir": config.output_dir, "model": str(Path(config.output_dir) / "final"), **log[-1]}))


def cmd_finetune_lm(args: argparse.Namespace) -> None:
    from ..training.lm_finetune import LMFinetuneConfig, finetune_lm

    config = dataclass_from_args(LMFinetuneConfig, args)
    log = finetune_lm(config, resume=args.resume)
    curve = [r for r in log if "heldout_loss" in r]
    print(json.dumps({"output_dir": config.output_dir, "adapter": str(Path(config.output_dir) / "final"), **log[-1],
                      **({"heldout_loss": curve[-1]["heldout_loss"]} if curve else {})}))


def cmd_index(args: argparse.Namespace) -> None:
    from encoders.hybrid import HybridEncoder
    from retrieval import DocumentIndex
    from retrieval.index.ann import IndexConfig
    from retrieval.index.hybrid import HybridIndex
    from retrieval.loading import document_encoder, is_hybrid_encoder

    from ..data.corpora import CORPORA, corpus_split
    from ..hardware.precision import encode_autocast

    if (args.phrase_vectors or args.document_states) and min(args.shard_documents, args.batch_size) < 1:
        raise ValueError(f"--shard-documents {args.shard_documents} and --states-batch-size {args.batch_size} must be "
                         ">= 1")  # before minutes of indexing
    part = ""
    if args.data in CORPORA:
        training, held_out = corpus_split(args.data)
        source = training + held_out if args.include_held_out else training
        part = (f" (all of {args.data}, its {len(held_out)} held-out documents included: dynvocab eval refuses this index)"
                if args.include_held_out else
                f" (the training part of {args.data}: its {len(held_out)} held-out documents, which dynvocab eval prompts "
                "with, are left out; --include-held-out adds them)")
    else:
        source = args.data
    if not isinstance(source, list) and not Path(source).exists() and Path(source).suffix in (".jsonl", ".txt", ".json"):
        raise FileNotFoundError(f"--data {source!r} does not exist; pass a JSONL or text file, a folder, or 'wikipedia'")
    if is_hybrid_encoder(args.encoder):
        if args.shards is not None:
            raise ValueError("--shards builds dense indexes only; drop --shards for a hybrid encoder, or pass a dense "
                             "--encoder")
        encoder = HybridEncoder.from_pretrained(args.encoder, representation=args.representation)
        with encode_autocast(encoder.device):  # bf16 only where the device computes it natively
            hybrid = HybridIndex.build(source, encoder, candidates=args.candidates, query_terms=args.query_terms,
                                       posting_terms=args.posting_terms, text_field=args.text_field, show_progress_bar=True)
        hybrid.save(args.output)
        print(f"indexed {len(hybrid)} documents{part} (hybrid {hybrid.encoder_info['label']}) into {args.output}")
    elif args.shards is not None:
        if not build_from_shards(args, source, part):
            return  # this process encoded its shard; another run merges
    else:
        encoder = document_encoder(args.encoder)
        index = DocumentIndex.build(source, encoder, config=IndexConfig(index_type=args.index_type, pq_m=args.pq_m),
                                    text_field=args.text_field, show_progress_bar=True)
        index.save(args.output)
        print(f"indexed {len(index)} documents{part} ({index.kind}) into {args.output}")
    args.index = args.output
    if args.phrase_vectors:
        cmd_phrase_vectors(args)
    if args.document_states:
        cmd_document_states(args)


def build_from_shards(args: argparse.Namespace, source, part: str) -> bool:
    """Encode the shards this process owns that are missing, then (main process, all shards there) merge them into
    the index at ``--output``; returns whether the index was written."""
    import time

    from accelerate import PartialState

    from retrieval import DocumentIndex
    from retrieval.index.ann import IndexConfig
    from retrieval.index.documents import load_documents
    from retrieval.index.shards import encode_shard, missing_shards, read_shards, shard_rows
    from retrieval.loading import document_encoder

    from ..hardware.precision import cpu_processes, encode_autocast

    state = PartialState(cpu=cpu_processes())
    num_shards = args.num_shards if args.num_shards is not None else state.num_processes
    if num_shards < 1:
        raise ValueError(f"--num-shards {num_shards} must be >= 1")
    if args.shard is not None and not 0 <= args.shard < num_shards:
        raise ValueError(f"--shard {args.shard} does not exist in --num-shards {num_shards}; pass 0..{num_shards - 1}")
    documents = load_documents(source, text_field=args.text_field)
    encoder = document_encoder(args.encoder, device=state.device)
    mine = [args.shard] if args.shard is not None else list(range(state.process_index, num_shards, state.num_processes))
    todo = [shard for shard in missing_shards(args.shards, num_shards) if shard in mine]
    start = time.perf_counter()
    with encode_autocast(encoder.device):
        for shard in todo:
            encode_shard(documents, encoder, args.shards, shard, num_shards, show_progress_bar=state.is_main_process)
    seconds = time.perf_counter() - start
    encoded = sum(len(shard_rows(len(documents), shard, num_shards)) for shard in todo)
    print(json.dumps({"process": state.process_index, "shards_encoded": todo, "documents": encoded,
                      "seconds": round(seconds, 2), "documents_per_s": round(encoded / seconds, 1) if encoded else None}))
    if args.shard is not None:
        missing = missing_shards(args.shards, num_shards)
        if missing:
            print(f"shard {args.shard} of {num_shards} is in {args.shards}; {len(missing)} still missing. When every "
                  f"shard is there: dynvocab index --data {args.data} --shards {args.shards} --num-shards "
                  f"{num_shards} --output {args.output}")
            return False
    state.wait_for_everyone()
    if not state.is_main_process:
        return False
    vectors = read_shards(documents, args.shards, num_shards, encoder)
    index = DocumentIndex.build(documents, encoder, vectors=vectors,
                                config=IndexConfig(index_type=args.index_type, pq_m=args.pq_m))
    index.save(args.output)
    print(f"indexed {len(index)} documents{part} ({index.kind}, from {num_shards} shards in {args.shards}) into "
          f"{args.output}")
    return True


def cmd_phrase_vectors(args: argparse.Namespace) -> None:
    from retrieval.config import PipelineConfig
    from retrieval.loading import load_stack
    from retrieval.phrase_vectors import build_phrase_vectors

    config = PipelineConfig(unit=args.unit, min_length=args.min_length, max_length=args.max_length, edges=args.edges)
    if args.shard_documents < 1:  # before minutes of loading
        raise ValueError(f"--shard-documents {args.shard_documents} must be >= 1")
    model, index = load_stack(args.model, args.checkpoint, args.index, args.encoder)
    store = build_phrase_vectors(model, index, config, shard_documents=args.shard_documents, overwrite=args.overwrite,
                                 show_progress_bar=True)
    stats = store.stats()
    print(json.dumps({"phrase_vectors": str(store.directory), "phrases": stats["phrases"], "documents": len(index),
                      "disk_mb": round(stats["disk_bytes"] / 2**20, 1),
                      "memory_mb": round(stats["resident_bytes"] / 2**20, 1)}))


def cmd_document_states(args: argparse.Namespace) -> None:
    from dynvocab.states.store import DocumentStates
    from retrieval.document_states import build_document_states
    from retrieval.loading import load_stack

    if args.shard_documents < 1 or args.batch_size < 1:  # before minutes of loading
        raise ValueError(f"--shard-documents {args.shard_documents} and --batch-size {args.batch_size} must be >= 1")
    model, index = load_stack(args.model, args.checkpoint, args.index, args.encoder)
    states = DocumentStates(model.lm, batch_size=args.batch_size, max_bytes=0)  # the pipeline's max_tokens
    store = build_document_states(states, model.tokenizer, index, dtype=args.dtype,
                                  shard_documents=args.shard_documents, overwrite=args.overwrite, show_progress_bar=True)
    stats = store.stats()
    print(json.dumps({"document_states": str(store.directory), "documents": stats["documents"],
                      "tokens": stats["tokens"], "disk_mb": round(stats["disk_bytes"] / 2**20, 1),
                      "memory_mb": round(stats["resident_bytes"] / 2**20, 1)}))


def cmd_document_kv(args: argparse.Namespace) -> None:
    from dynvocab.states.kv import DocumentKV
    from retrieval.document_states import build_document_kv
    from retrieval.loading import load_stack

    if args.shard_documents < 1 or args.batch_size < 1 or args.read_tokens < 1:  # before minutes of loading
        raise ValueError(f"--shard-documents {args.shard_documents}, --batch-size {args.batch_size} and --read-tokens "
                         f"{args.read_tokens} must be >= 1")
    model, index = load_stack(args.model, args.checkpoint, args.index, args.encoder)
    kv = DocumentKV(model.lm, batch_size=args.batch_size, max_bytes=0)
    store = build_document_kv(kv, model.tokenizer, index, args.read_tokens, dtype=args.dtype,
                              shard_documents=args.shard_documents, overwrite=args.overwrite, show_progress_bar=True)
    stats = store.stats()
    print(json.dumps({"document_kv": str(store.directory), "documents": stats["documents"], "tokens": stats["tokens"],
                      "disk_mb": round(stats["disk_bytes"] / 2**20, 1),
                      "memory_mb": round(stats["resident_bytes"] / 2**20, 1)}))


def cmd_generate(args: argparse.Namespace) -> None:
    from retrieval.config import PipelineConfig
    from retrieval.loading import load_stack
    from retrieval.pipeline import PhrasePipeline, check_prompts

    from ..loading import freeze_loaded_objects

    config = dataclass_from_args(PipelineConfig, args)
    check_prompts(args.prompt)  # before minutes of loading
    model, index = load_stack(args.model, args.checkpoint, args.index, args.encoder)
    pipeline = PhrasePipeline(model, index, config)
    freeze_loaded_objects()
    for prompt in args.prompt:
        result = pipeline(prompt)
        print(prompt + result.marked())
        for line in result.sources():
            print("  " + line)
        print("  latency: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in result.latency.items()))


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    if args.prompts < 1 or args.max_new_tokens < 1:
        raise ValueError(f"--prompts {args.prompts} and --max-new-tokens {args.max_new_tokens} must be >= 1")
    run_demo(prompts=args.prompts, max_new_tokens=args.max_new_tokens, workdir=Path(args.workdir))


def cmd_eval(args: argparse.Namespace) -> None:
    from evals.protocol import EvalConfig, generate_all
    from evals.report import index_leak, mauve_bounds, score_all, write_report

    config = dataclass_from_args(EvalConfig, args)
    records, timed, generators = generate_all(config)
    results = score_all(records, timed, config, generators)
    bounds = mauve_bounds(records, config, generators)
    report = write_report(results, config, "dynvocab " + " ".join(args.argv), generators.settings(), bounds,
                          index_leak(records, config, generators))
    print(report.read_text())


def cmd_pretrain_encoder(args: argparse.Namespace) -> None:
    from retrieval.training.pretraining import PretrainConfig, pretrain

    config = dataclass_from_args(PretrainConfig, args)
    final = pretrain(config, resume=args.resume)
    print(json.dumps({"output_dir": config.output_dir, **final}))


def cmd_finetune_encoder(args: argparse.Namespace) -> None:
    from retrieval.training.finetuning import FinetuneConfig, finetune

    config = dataclass_from_args(FinetuneConfig, args)
    final = finetune(config, resume=args.resume)
    print(json.dumps({"output_dir": config.output_dir, **final}))


def cmd_soup_encoders(args: argparse.Namespace) -> None:
    from retrieval.training.soup import soup_encoders

    encoders = [path for path in args.encoders.split(",") if path]
    output = soup_encoders(encoders, args.output, base=args.base, base_weight=args.base_weight)
    print(json.dumps({"soup": str(output), "encoders": encoders, "base": args.base, "base_weight": args.base_weight}))


def cmd_extract_adapter(args: argparse.Namespace) -> None:
    from retrieval.training.adapter import extract_adapter

    report = extract_adapter(args.encoder, args.output, base=args.base, rank=args.rank)
    print(json.dumps({"adapter": args.output, **{k: v for k, v in report.items() if k != "relative_errors"}}))


def cmd_eval_retrieval(args: argparse.Namespace) -> None:
    from evals.retrieval.config import RetrievalEvalConfig
    from evals.retrieval.protocol import evaluate_retrieval

    config = dataclass_from_args(RetrievalEvalConfig, args)
    print(evaluate_retrieval(config, "dynvocab " + " ".join(args.argv)).read_text())


def cmd_build_vocab(args: argparse.Namespace) -> None:
    from retrieval.nar.recipes import build_vocab

    print(json.dumps(build_vocab(args.data, args.output, args)))


def cmd_pseudo_queries(args: argparse.Namespace) -> None:
    import torch

    from retrieval.index.documents import load_documents
    from retrieval.nar.pseudo_queries import read_pseudo_queries, write_pseudo_queries

    from ..data.assets import wikipedia_leads
    from ..loading import load_lm

    if min(args.per_document, args.batch_size) < 1:  # before the LM loads
        raise ValueError(f"--per-document {args.per_document} and --batch-size {args.batch_size} must be >= 1")
    documents = wikipedia_leads() if args.data == "wikipedia" else load_documents(args.data, text_field=args.text_field)
    lm, tokenizer = load_lm(args.model)
    lm.to(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    written = write_pseudo_queries(lm, tokenizer, documents, args.output, per_document=args.per_document,
                                   batch_size=args.batch_size, seed=args.seed, show_progress_bar=True)
    queries = read_pseudo_queries(args.output, documents)
    print(json.dumps({"output": args.output, "documents": len(queries), "written_now": written,
                      "queries": sum(map(len, queries)), "documents_without_query": sum(not q for q in queries)}))


def cmd_nar_train(args: argparse.Namespace) -> None:
    from retrieval.nar.recipes import nar_train
    from retrieval.nar.training import NarTrainConfig

    from ..scoring.shortlist_head import ShortlistConfig

    shortlist = ShortlistConfig(num_clusters=args.clusters, subset_size=args.subset_size, probe=args.probe)
    print(json.dumps(nar_train(args.data, args.vocab, args.encoder, dataclass_from_args(NarTrainConfig, args), args.resume,
                               args.cluster_steps, shortlist)))


def cmd_nar_search(args: argparse.Namespace) -> None:
    from retrieval.nar.recipes import nar_search

    for query, hits in zip(args.query, nar_search(args.model, args.query, args.shortlist, args.k, args.beam)):
        print(query)
        for rank, (docid, score) in enumerate(hits, 1):
            print(f"  {rank:2d}. {docid}  ({score:.2f})")


def cmd_qa(args: argparse.Namespace) -> None:
    from retrieval.loading import load_stack
    from retrieval.qa.answering import CitationQA, QAConfig

    from ..loading import freeze_loaded_objects

    config = dataclass_from_args(QAConfig, args)
    documents = [_document_arg(text, n) for n, text in enumerate(args.document or [], start=1)] or None
    if args.index and documents is None:
        model, index = load_stack(args.model, args.checkpoint, args.index, args.encoder)
    else:
        from retrieval.loading import leads_index

        from ..loading import SHIPPED_ENCODER, load_dynamic_lm

        index = None if documents else leads_index(Path(args.workdir), args.encoder)
        checkpoint = args.checkpoint or (SHIPPED_ENCODER if args.model == "smollm2" and SHIPPED_ENCODER.exists() else None)
        model = load_dynamic_lm(args.model, checkpoint)
    qa = CitationQA(model, index, config)
    freeze_loaded_objects()
    for question in args.question:
        result = qa(question, documents)
        print(f"Q: {question}\nA: {result.answer}")
        for number, document in enumerate(result.documents, start=1):
            mark = "*" if number in result.cited else " "
            print(f" {mark}[{number}] {document['title'] or document['id']}")
        origins = [c.origin for c in result.citations]
        made = (f"{origins.count('copy')} after spans copied verbatim" if config.grounded else
                f"{origins.count('phrase')} from phrases")
        print(f"  cited {result.cited or 'nothing'}: {made}, {origins.count('model')} written by the model; "
              f"{result.phrase_steps} of {result.steps} steps were phrases; {result.seconds:.1f} s")


def _document_arg(text: str, number: int) -> dict:
    """``--document "Title: text"`` (or plain text) as a document dict."""
    title, colon, body = text.partition(": ")
    if not colon or len(title) > 80:
        title, body = f"document {number}", text
    if not body.strip():
        raise ValueError(f"--document {text!r} has no text; pass 'Title: text' or plain text")
    return {"id": title, "title": title, "text": body}


def cmd_eval_qa(args: argparse.Namespace) -> None:
    from evals.qa.protocol import QAEvalConfig, generate_answers
    from evals.qa.report import write_report

    config = dataclass_from_args(QAEvalConfig, args)
    records, items, evidence, pages = generate_answers(config)
    print(write_report(config, "dynvocab " + " ".join(args.argv), records, items, evidence, pages).read_text())


def cmd_serve(args: argparse.Namespace) -> None:
    from ..serving.config import ServerConfig
    from ..serving.http.logs import JsonFormatter
    from ..serving.http.server import serve

    for handler in logging.getLogger().handlers:  # one JSON object per log line, with the request id
        handler.setFormatter(JsonFormatter())
    serve(dataclass_from_args(ServerConfig, args))


def add_phrase_vector_arguments(parser: argparse.ArgumentParser, with_index: bool) -> None:
    """The flags of ``phrase-vectors``; ``index --phrase-vectors`` shares them (its --encoder is the index's already)."""
    from retrieval.config import PipelineConfig

    defaults = PipelineConfig()
    if with_index:
        parser.add_argument("--index", required=True, help="directory written by `dynvocab index`")
        parser.add_argument("--encoder", default=DEFAULT_RETRIEVER, help=ENCODER_HELP)
    parser.add_argument("--model", default="smollm2", help="causal LM name or path")
    parser.add_argument("--checkpoint", default=None,
                        help="phrase-encoder checkpoint (save_pretrained directory); default: the shipped SmolLM2 one")
    parser.add_argument("--unit", default=defaults.unit, choices=["tokens", "words"], help="as generate will cut phrases")
    parser.add_argument("--min-length", type=int, default=defaults.min_length, help="as generate will cut phrases")
    parser.add_argument("--max-length", type=int, default=defaults.max_length, help="as generate will cut phrases")
    parser.add_argument("--edges", default=defaults.edges, choices=["content", "any"], help="as generate will cut phrases")
    parser.add_argument("--shard-documents", type=int, default=256, help="documents per shard: the unit of resuming")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a store beside the index made by another encoder or LM, dtypes, documents or "
                             "settings")


def add_document_store_arguments(parser: argparse.ArgumentParser, shard_documents: int) -> None:
    """The flags ``document-states`` and ``document-kv`` share: the index, the LM that will decode, resuming."""
    parser.add_argument("--index", required=True, help="directory written by `dynvocab index`")
    parser.add_argument("--encoder", default=DEFAULT_RETRIEVER, help=ENCODER_HELP)
    parser.add_argument("--model", default="smollm2", help="causal LM name or path: the LM that will decode")
    parser.add_argument("--checkpoint", default=None,
                        help="phrase-encoder checkpoint (save_pretrained directory; its LM weights, if it trained them); "
                             "default: the shipped SmolLM2 one")
    parser.add_argument("--shard-documents", type=int, default=shard_documents,
                        help="documents per shard: the unit of resuming")
    parser.add_argument("--overwrite", action="store_true", help="replace states made by another LM, documents or settings")


def add_document_state_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The flags of ``document-states`` beyond those it shares with ``phrase-vectors``; ``index --document-states``
    takes them as ``--states-dtype`` and ``--states-batch-size``."""
    parser.add_argument(f"--{prefix}dtype", dest="dtype", default="float16", choices=["float16", "float32"],
                        help="states on disk: float16 (half the size; its keys within 1e-6 cosine of the LM's own) "
                             "or float32")
    parser.add_argument(f"--{prefix}batch-size", dest="batch_size", type=int, default=8,
                        help="documents per LM forward call while reading the states")


def build_parser() -> argparse.ArgumentParser:
    from transformers import HfArgumentParser

    from evals.protocol import EvalConfig
    from evals.qa.protocol import QAEvalConfig
    from evals.retrieval.config import RetrievalEvalConfig
    from retrieval.config import PipelineConfig
    from retrieval.nar.training import NarTrainConfig
    from retrieval.nar.vocab import PhraseVocabConfig
    from retrieval.qa.answering import QAConfig
    from retrieval.training.finetuning import FinetuneConfig
    from retrieval.training.pretraining import PretrainConfig

    from ..serving.config import ServerConfig
    from ..training.config import TrainConfig
    from ..training.lm_finetune import LMFinetuneConfig
    from ..training.multiword import MultiWordTrainConfig

    # one --flag (and --flag_name alias) per config field, typed from its annotation (transformers.HfArgumentParser)
    parser = HfArgumentParser(prog="dynvocab", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", dataclass_types=TrainConfig, help="train a phrase encoder (accelerate launch works too)")
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    train.set_defaults(func=cmd_train)

    cache = commands.add_parser(
        "cache-states", help="run the frozen LM once over the training text and store its states (accelerate launch works too)"
    )
    cache.add_argument("--model", default="smollm2", help="Hub name or path of the causal LM; 'smollm2' is the offline asset")
    cache.add_argument("--data", default="wikipedia", help="text/JSONL file, datasets name or dir; 'wikipedia' is the offline asset")
    cache.add_argument("--text-field", default="text")
    cache.add_argument("--held-out", type=float, default=TrainConfig.held_out,
                       help="share of the offline Wikipedia leads held out (never cached: dynvocab eval prompts with them)")
    cache.add_argument("--max-length", type=int, default=TrainConfig.max_length, help="tokens per chunk, as train cuts them")
    cache.add_argument("--batch-size", type=int, default=8, help="chunks per LM forward pass")
    cache.add_argument("--shard-chunks", type=int, default=256,
                       help="chunks per shard: the unit of resuming, and of the work split between processes")
    cache.add_argument("--output-dir", required=True, help="the cache folder; an interrupted build resumes there")
    cache.set_defaults(func=cmd_cache_states)

    train_mwt = commands.add_parser(
        "train-mwt", dataclass_types=MultiWordTrainConfig, help="train the MWT baseline: frequent n-grams as static tokens"
    )
    train_mwt.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    train_mwt.set_defaults(func=cmd_train_mwt)

    finetune_lm = commands.add_parser(
        "finetune-lm", dataclass_types=LMFinetuneConfig,
        help="fine-tune the LM itself on a domain with LoRA: the baseline of the domain table (accelerate launch works too)",
    )
    finetune_lm.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    finetune_lm.set_defaults(func=cmd_finetune_lm)

    index = commands.add_parser("index", help="encode documents and build a FAISS index")
    index.add_argument("--data", default="wikipedia", help="documents: JSONL/text file, datasets name, or an embedded corpus's "
                       "indexed part: 'wikipedia', 'licenses', 'licensedb' or 'licensedb-families'")
    index.add_argument("--output", required=True, help="directory of the saved index")
    index.add_argument("--encoder", default=DEFAULT_RETRIEVER, help=ENCODER_HELP + "; "
                       "a finetune-encoder --encoder hybrid output builds a hybrid (dense + sparse) index")
    index.add_argument("--representation", default="both", choices=["cls", "ot", "both", "both-260"],
                       help="hybrid encoders only: CLS only, OT only, CLS:384/OT:384 or CLS:384/OT:260")
    index.add_argument("--candidates", type=int, default=32,
                       help="hybrid only: candidates each part proposes before their union is scored exactly")
    index.add_argument("--query-terms", type=int, default=16,
                       help="hybrid only: a query's heaviest sparse ids whose posting lists are walked")
    index.add_argument("--posting-terms", type=int, default=32,
                       help="hybrid only: each document's heaviest sparse entries kept in the posting lists "
                            "(raise both for an OT-only index)")
    index.add_argument("--index-type", default="auto", choices=["auto", "flat", "ivf", "ivfpq", "hnsw"],
                       help="ivfpq: --pq-m bytes a vector instead of 4 d, for corpora past memory")
    index.add_argument("--pq-m", type=int, default=None,
                       help="ivfpq: bytes a vector, a divisor of the dimension (default d/4: 96 for a MiniLM vector "
                            "instead of 1,536, recall@10 0.89 against flat in docs/indexing.md; 192: 0.96)")
    index.add_argument("--shards", default=None,
                       help="encode in shards kept in this folder (resumable; the processes of `accelerate launch` "
                            "share them), then merge them into --output")
    index.add_argument("--num-shards", type=int, default=None,
                       help="with --shards: how many (default: the number of processes); keep it across resumes")
    index.add_argument("--shard", type=int, default=None,
                       help="with --shards: encode only this shard (one machine of several); a later run without "
                            "--shard merges")
    index.add_argument("--include-held-out", action="store_true",
                       help="embedded corpora: index the held-out documents too (dynvocab eval then refuses the index)")
    index.add_argument("--text-field", default="text")
    index.add_argument("--phrase-vectors", action="store_true",
                       help="then encode every document's phrases once and keep them beside the index "
                            "(what `dynvocab phrase-vectors` does; run that to resume)")
    index.add_argument("--document-states", action="store_true",
                       help="then read every document once with the LM and keep its states beside the index, for the "
                            "state gate (what `dynvocab document-states` does; run that to resume)")
    add_phrase_vector_arguments(index, with_index=False)
    add_document_state_arguments(index, prefix="states-")
    index.set_defaults(func=cmd_index)

    vectors = commands.add_parser(
        "phrase-vectors", help="encode the phrases of every indexed document once, beside the index (resumable)"
    )
    add_phrase_vector_arguments(vectors, with_index=True)
    vectors.set_defaults(func=cmd_phrase_vectors)

    states = commands.add_parser(
        "document-states", help="the LM's states over every indexed document, once, beside the index, for the state "
                                "gate (state_threshold; resumable)"
    )
    add_document_store_arguments(states, shard_documents=256)
    add_document_state_arguments(states)
    states.set_defaults(func=cmd_document_states)

    kv = commands.add_parser(
        "document-kv", help="the LM's keys and values over every indexed document, once, beside the index, for "
                            "grounded decoding without the documents' prefill (document_kv; resumable)"
    )
    add_document_store_arguments(kv, shard_documents=64)
    add_document_state_arguments(kv)
    kv.set_defaults(batch_size=4, dtype="float32")  # float32: the first document exactly as the LM reads it
    kv.add_argument("--read-tokens", type=int, default=384,
                    help="tokens kept of each document: the pipeline's read_tokens (a store for another count is not found)")
    kv.set_defaults(func=cmd_document_kv)

    generate = commands.add_parser("generate", dataclass_types=PipelineConfig, help="retrieve, plug in phrases, generate")
    generate.add_argument("--index", required=True, help="directory written by `dynvocab index`")
    generate.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)")
    generate.add_argument("--model", default="smollm2", help="causal LM name or path")
    generate.add_argument("--checkpoint", default=None, help="phrase-encoder checkpoint (save_pretrained directory); default: the shipped SmolLM2 one")
    generate.add_argument("--encoder", default=DEFAULT_RETRIEVER, help=ENCODER_HELP)
    generate.set_defaults(func=cmd_generate)

    evaluate = commands.add_parser(
        "eval", dataclass_types=EvalConfig, help="the paper's protocol and metrics against baselines; resumable"
    )
    evaluate.set_defaults(func=cmd_eval)

    pretrain_encoder = commands.add_parser("pretrain-encoder", dataclass_types=PretrainConfig,
                                           help="DupMAE pre-training of a BERT-like encoder (accelerate launch works too)")
    pretrain_encoder.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    pretrain_encoder.set_defaults(func=cmd_pretrain_encoder)

    finetune_encoder = commands.add_parser("finetune-encoder", dataclass_types=FinetuneConfig,
                                           help="contrastive fine-tuning with in-batch, then ANN hard negatives")
    finetune_encoder.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    finetune_encoder.set_defaults(func=cmd_finetune_encoder)

    soup = commands.add_parser("soup-encoders", help="average fine-tuned encoders' weights (a model soup), optionally "
                               "mixed with the encoder they started from (WiSE-FT)")
    soup.add_argument("--encoders", required=True, help="comma-separated finetune-encoder final folders, all dense or all "
                      "hybrid (a hybrid soup mixes only its body and projection with --base)")
    soup.add_argument("--output", required=True, help="folder of the averaged encoder")
    soup.add_argument("--base", default=None, help="the encoder they were fine-tuned from ('minilm' is the offline asset)")
    soup.add_argument("--base-weight", type=float, default=0.0, help="share of the base's weights, in [0, 1)")
    soup.set_defaults(func=cmd_soup_encoders)

    extract = commands.add_parser("extract-adapter", help="a fine-tuned encoder (or soup) as a small LoRA adapter on the "
                                  "encoder it started from, for --encoder anywhere")
    extract.add_argument("--encoder", required=True, help="finetune-encoder or soup-encoders output (dense, or a hybrid "
                         "with a mean-pooled identity projection)")
    extract.add_argument("--output", required=True, help="folder of the adapter (peft format)")
    extract.add_argument("--base", default="minilm", help="the encoder it was fine-tuned from ('minilm': the offline "
                         "asset, recorded by its Hub name)")
    extract.add_argument("--rank", type=int, default=32, help="rank kept of each weight's difference")
    extract.set_defaults(func=cmd_extract_adapter)

    eval_retrieval = commands.add_parser("eval-retrieval", dataclass_types=RetrievalEvalConfig,
                                         help="retrievers over all 10,033 leads, exact, with paired intervals against "
                                              "MiniLM; --quick true: the 800-document run")
    eval_retrieval.set_defaults(func=cmd_eval_retrieval)

    demo = commands.add_parser("demo", help="the main job on the embedded default (SmolLM2, Wikipedia)")
    demo.add_argument("--prompts", type=int, default=4, help="held-out prompts to run")
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--workdir", default=".cache/demo", help="where the index and a trained encoder are cached")
    demo.set_defaults(func=cmd_demo)

    vocab = commands.add_parser("build-vocab", dataclass_types=PhraseVocabConfig,
                                help="build a phrase vocabulary for docids (TokenMonster-style, offline)")
    vocab.add_argument("--data", default="wikipedia", help="'wikipedia' (the leads' titles) or a text file, one docid per line")
    vocab.add_argument("--output", required=True, help="directory of the saved vocabulary")
    vocab.set_defaults(func=cmd_build_vocab)

    pseudo = commands.add_parser("pseudo-queries", help="sample search queries for each document with an instruction "
                                                        "LM: PIXAR's docids (resumable JSONL)")
    pseudo.add_argument("--data", default="wikipedia", help="'wikipedia' (the leads) or a JSONL/text file of documents")
    pseudo.add_argument("--text-field", default="text")
    pseudo.add_argument("--model", default="smollm2", help="an instruction-tuned causal LM ('smollm2': SmolLM2-135M-"
                                                           "Instruct, the offline asset)")
    pseudo.add_argument("--output", required=True, help="JSONL file, appended to and resumed")
    pseudo.add_argument("--per-document", type=int, default=4, help="queries sampled a document (duplicates dropped)")
    pseudo.add_argument("--batch-size", type=int, default=32)
    pseudo.add_argument("--seed", type=int, default=0)
    pseudo.add_argument("--device", default=None, help="default: cuda when there is one")
    pseudo.set_defaults(func=cmd_pseudo_queries)

    nar = commands.add_parser("nar-train", dataclass_types=NarTrainConfig,
                              help="train a non-autoregressive generative retriever, then its shortlist clusters")
    nar.add_argument("--vocab", required=True, help="directory written by `dynvocab build-vocab`")
    nar.add_argument("--data", default="wikipedia",
                     help="'wikipedia' (lead sentences -> titles) or a JSONL file of {\"query\": ..., \"docid\": ...}")
    nar.add_argument("--encoder", default="minilm", help="HF encoder name or path ('minilm' is the offline asset)")
    nar.add_argument("--cluster-steps", type=int, default=300, help="steps of the learned cluster fit (0: skip it)")
    nar.add_argument("--clusters", type=int, default=1024,
                     help="learned shortlist clusters (at most one per training query); with --subset-size 384 and "
                          "--probe 8 they kept full scoring's MRR@10 on an 8,192-phrase vocabulary "
                          "(results/nar/shortlist-screen)")
    nar.add_argument("--subset-size", type=int, default=384, help="ids in each learned cluster's subset")
    nar.add_argument("--probe", type=int, default=8, help="clusters probed per query")
    nar.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    nar.set_defaults(func=cmd_nar_train)

    search = commands.add_parser("nar-search", help="retrieve docids for queries with a trained NAR retriever")
    search.add_argument("--model", required=True, help="the --output-dir of `dynvocab nar-train`")
    search.add_argument("--query", action="append", required=True, help="a query (repeatable)")
    search.add_argument("--shortlist", action="store_true", help="score each query's shortlist instead of every id")
    search.add_argument("--k", type=int, default=10, help="documents shown per query")
    search.add_argument("--beam", type=int, default=20, help="beam size of the trie search")
    search.set_defaults(func=cmd_nar_search)

    qa = commands.add_parser("qa", dataclass_types=QAConfig,
                             help="answer questions with [n] citations placed from phrase provenance")
    qa.add_argument("--question", action="append", required=True, help="a question (repeatable)")
    qa.add_argument("--document", action="append", default=None,
                    help="a document, 'Title: text' (repeatable; numbered in order); default: retrieve --top-k")
    qa.add_argument("--index", default=None, help="directory written by `dynvocab index`; default: every Wikipedia lead")
    qa.add_argument("--workdir", default=".cache/demo", help="where the default index is cached")
    qa.add_argument("--model", default="smollm2", help="causal LM name or path (chat/instruct models use their template)")
    qa.add_argument("--checkpoint", default=None, help="phrase-encoder checkpoint; default: the shipped SmolLM2 one")
    qa.add_argument("--encoder", default=DEFAULT_RETRIEVER, help=ENCODER_HELP)
    qa.set_defaults(func=cmd_qa)

    eval_qa = commands.add_parser("eval-qa", dataclass_types=QAEvalConfig,
                                  help="citation-aware QA: bare LM against phrase systems; ALCE-style scores; resumable")
    eval_qa.set_defaults(func=cmd_eval_qa)

    serve = commands.add_parser("serve", dataclass_types=ServerConfig,
                                help="an OpenAI-compatible HTTP server: per-request phrase sets, batched ([serve] extra)")
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as error:  # what the library raises for a user's input
        print(f"dynvocab {args.command}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
    finally:
        _leave_process_group()


def _leave_process_group() -> None:
    """Destroy the process group a command joined under ``accelerate launch``, as ``Accelerator.end_training`` does:
    left to the interpreter's exit, a process could abort after its work was saved ("terminate called without an
    active exception", seen in the two-process trainer tests)."""
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
