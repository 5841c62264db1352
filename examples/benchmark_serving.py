"""Load benchmark of ``dynvocab serve`` on loopback: concurrency 1, 4 and 8, each request with its own phrase set,
against the bare LM served the same way, with a burst that fills the queue.

The server runs in this process (uvicorn in a thread, 127.0.0.1, a free port); clients are a bounded asyncio loop of
httpx streams, so time to first step is measured on the wire. Held-out Wikipedia leads give the prompts (their first
32 tokens); each request retrieves its own ``--retrieve`` documents from the served index (the training leads) and
the phrases are cut from them. Every prompt first runs alone (greedy: the reference answers, and the phrase cache is
warm after it: the rows "first"); then each concurrency level sends all prompts, with phrases and bare. Reports
requests/s, steps/s, p50/p95 latency, p50 time to first step, 5xx count, answers equal to their lone answer, rows
decoded together per step (continuous batching), and the 503s of the burst. ``--state-threshold T`` adds a third run
beside those two at every level: the phrased requests with the state gate (``state_threshold``), whose encode stage
then holds the LM's pass over documents no earlier request brought, unless the index keeps the LM's document states
(``dynvocab document-states``; ``--without-document-states`` leaves them unread). ``--draft-tokens N`` adds the
phrased requests with verified decoding and drafts from their documents (``verify_top_k=1``, ``agreement_top_k=1``,
``draft_tokens=N``: the bare LM's text). ``--waiting`` adds the phrased (grounded) requests with joining off: a
running grounded batch takes no newcomer, as the engine did before grounded rows joined between steps
(``VERIFIED_TABLE_PHRASES`` below zero), so the levels show what continuous joining changes. ``--read-both`` adds the
phrased (grounded) requests with ``document_kv=0``: the LM reads both documents, where by default the first comes
from a float32 store beside the served index when there is one (``dynvocab document-kv``); ``--data licenses`` takes
the prompts from the held-out licences, for a licence index. Time per character
written compares modes whose requests write different amounts of text in their ``--max-tokens`` ids (a phrase is one
id); the rows "paired" send each prompt in every mode in turn, one at a time, and give each mode's time per character
over the bare LM's on the same prompt (median), which a drifting machine moves less than the levels' figures.

    nice -n 10 python examples/benchmark_serving.py --num-prompts 16 --max-tokens 32 --output results/serving/load
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import torch


def prompts_of(count: int, tokenizer, prefix_tokens: int = 32, data: str = "wikipedia") -> list[str]:
    """The first ``prefix_tokens`` tokens of the first ``count`` held-out texts of ``data`` (Wikipedia leads)."""
    from dynvocab.data.corpora import corpus_split

    prompts = []
    for lead in corpus_split(data)[1]:
        ids = tokenizer(lead["text"], add_special_tokens=False).input_ids
        if len(ids) > prefix_tokens:
            prompts.append(tokenizer.decode(ids[:prefix_tokens]))
        if len(prompts) == count:
            return prompts
    return prompts


def start_server(engine, config) -> tuple[str, object, threading.Thread]:
    import uvicorn

    from dynvocab.serving.http.app import create_app

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine, config), log_config=None, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{listener.getsockname()[1]}", server, thread


async def one(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    """One streamed request: status, seconds to the first step and to the end, text, steps, Retry-After."""
    start, first, text, steps, stages = time.perf_counter(), None, "", 0, {}
    async with client.stream("POST", f"{url}/v1/completions", json=body | {"stream": True, "stream_options":
                                                                          {"include_usage": True}}) as reply:
        if reply.status_code != 200:
            await reply.aread()
            return {"status": reply.status_code, "retry_after": reply.headers.get("retry-after")}
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            stages = chunk.get("dynvocab", {}).get("stages", stages)
            if "usage" in chunk:
                steps = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["finish_reason"] is None:
                first = first or time.perf_counter()
                text += chunk["choices"][0]["text"]
    end = time.perf_counter()
    return {"status": 200, "first_s": (first or end) - start, "seconds": end - start, "text": text, "steps": steps,
            "stages": stages}


async def run_paired(url: str, modes: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each prompt in every mode in turn, one request at a time: the machine's drift reaches every mode alike."""
    replies: dict[str, list[dict]] = {mode: [] for mode in modes}
    async with httpx.AsyncClient(timeout=600) as client:
        for bodies in zip(*modes.values()):
            for mode, body in zip(modes, bodies):
                replies[mode].append(await one(client, url, body))
    return replies


def per_char_over(replies: list[dict], bare: list[dict]) -> float:
    """The median over prompts of a reply's seconds per character over the bare LM's on the same prompt."""
    return statistics.median((r["seconds"] / max(len(r["text"]), 1)) / (b["seconds"] / max(len(b["text"]), 1))
                             for r, b in zip(replies, bare))


async def run_level(url: str, bodies: list[dict], concurrency: int) -> tuple[list[dict], float]:
    """All ``bodies`` with at most ``concurrency`` in flight; the replies in order and the wall time."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        async def gated(body: dict) -> dict:
            async with gate:
                return await one(client, url, body)

        start = time.perf_counter()
        replies = await asyncio.gather(*(gated(body) for body in bodies))
    return list(replies), time.perf_counter() - start


def batches(url: str) -> tuple[float, float]:
    """The server's batch-size histogram so far: (rows over all decoding steps, decoding steps)."""
    metrics = dict(line.rsplit(" ", 1) for line in httpx.get(f"{url}/metrics").text.splitlines() if line[:1] != "#")
    return float(metrics["dynvocab_batch_size_sum"]), float(metrics["dynvocab_batch_size_count"])


def summary(replies: list[dict], seconds: float, lone: list[dict], bare: list[dict]) -> dict:
    """A level's figures; ``lone`` its mode's answers alone, ``bare`` the bare LM's (each text or a prefix of it
    counts as the bare LM's: ``max_tokens`` ids hold more text when some are phrases)."""
    done = [r for r in replies if r["status"] == 200]
    latency = sorted(r["seconds"] for r in done)
    return {
        "requests": len(replies), "answered": len(done), "5xx": sum(r["status"] >= 500 for r in replies),
        "requests_per_s": len(done) / seconds, "steps_per_s": sum(r["steps"] for r in done) / seconds,
        "p50_s": statistics.median(latency), "p95_s": latency[min(len(latency) - 1, round(0.95 * (len(latency) - 1)))],
        "first_step_p50_s": statistics.median(r["first_s"] for r in done),
        "ms_per_char": 1e3 * sum(r["seconds"] for r in done) / max(sum(len(r["text"]) for r in done), 1),
        "equal_to_lone": sum(r.get("text") == alone.get("text") for r, alone in zip(replies, lone)),
        "bare_lm_text": sum(_one_extends_the_other(r.get("text"), plain.get("text"))
                            for r, plain in zip(replies, bare)),
        "stages_p50_ms": {stage: 1e3 * statistics.median(r["stages"].get(stage, 0.0) for r in done)
                          for stage in ("retrieve", "extract", "encode", "decode")},
    }


def _one_extends_the_other(text: str | None, other: str | None) -> bool:
    return text is not None and other is not None and (text.startswith(other) or other.startswith(text))


async def burst(url: str, size: int) -> dict:
    """``size`` one-step requests at once: how many were refused with 503, all with Retry-After."""
    async with httpx.AsyncClient(timeout=600) as client:
        replies = await asyncio.gather(*(client.post(f"{url}/v1/completions", json={
            "prompt": "The", "max_tokens": 1, "temperature": 0}) for _ in range(size)))
    refused = [r for r in replies if r.status_code == 503]
    return {"sent": size, "ok": sum(r.status_code == 200 for r in replies), "refused_503": len(refused),
            "refused_with_retry_after": sum("retry-after" in r.headers for r in refused),
            "other": sum(r.status_code not in (200, 503) for r in replies)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="LM name or path (a tiny one in the tests)")
    parser.add_argument("--checkpoint", default=None, help="phrase-encoder checkpoint; default: the shipped one")
    parser.add_argument("--index", default="wikipedia", help="served corpus ('none': each request sends its lead)")
    parser.add_argument("--num-prompts", type=int, default=16, help="held-out prompts per run")
    parser.add_argument("--max-tokens", type=int, default=32, help="decoding steps per request")
    parser.add_argument("--retrieve", type=int, default=8, help="documents each request retrieves")
    parser.add_argument("--concurrency", default="1,4,8", help="client concurrency levels")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-wait-ms", type=float, default=10.0)
    parser.add_argument("--max-queue", type=int, default=16, help="the burst sends 3x this many")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--state-threshold", type=float, help="also run the phrased requests with this state gate")
    parser.add_argument("--without-document-states", action="store_true",
                        help="do not read the LM's document states kept beside the index (`dynvocab document-states`): "
                             "the gated requests' first pass then reads its documents with the LM")
    parser.add_argument("--draft-tokens", type=int, default=0,
                        help="also run the phrased requests verified, with drafts of this many tokens (0: not)")
    parser.add_argument("--waiting", action="store_true",
                        help="also run the phrased requests with joining off (a running grounded batch takes no newcomer)")
    parser.add_argument("--read-both", action="store_true",
                        help="also run the phrased (grounded) requests with document_kv=0: the LM reads every document "
                             "itself, where the default takes the first from a float32 store beside the served index")
    parser.add_argument("--data", default="wikipedia", help="whose held-out texts give the prompts ('licenses': the "
                                                            "held-out licences, for a licence index)")
    parser.add_argument("--no-repeat-ngram-size", type=int, default=4, help="every request's n-gram guard")
    parser.add_argument("--output", help="folder for benchmark.json and benchmark.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from dynvocab.serving import ServerConfig
    from dynvocab.serving.http.server import load_engine

    config = ServerConfig(model=args.model, checkpoint=args.checkpoint, index=args.index, port=0,
                          max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms, max_queue=args.max_queue,
                          max_tokens_limit=args.max_tokens)
    engine = load_engine(config)
    if args.without_document_states:
        engine.document_states.use_store(None)
    url, server, thread = start_server(engine, config)
    prompts = prompts_of(args.num_prompts, engine.model.tokenizer, data=args.data)
    base = {"max_tokens": args.max_tokens, "temperature": 0, "no_repeat_ngram_size": args.no_repeat_ngram_size}
    if engine.corpora:
        phrased = [base | {"prompt": p, "retrieve": args.retrieve} for p in prompts]
    else:  # no index: each request brings a document of its own (the next prompt's text)
        phrased = [base | {"prompt": p, "documents": [prompts[(i + 1) % len(prompts)]]} for i, p in enumerate(prompts)]
    modes = {"bare": [base | {"prompt": p} for p in prompts], "phrases": phrased}  # the bare LM's answers first
    if args.state_threshold is not None:
        modes["gated"] = [body | {"state_threshold": args.state_threshold} for body in phrased]
    if args.draft_tokens:
        verified = {"verify_top_k": 1, "agreement_top_k": 1, "draft_tokens": args.draft_tokens}
        modes["drafted"] = [body | verified for body in phrased]
    if args.waiting:
        modes["waiting"] = phrased
    if args.read_both:
        modes["read-both"] = [body | {"document_kv": 0} for body in phrased]
    lone, levels = {}, {}
    from dynvocab.serving.engine import engine as engine_module

    joining = engine_module.VERIFIED_TABLE_PHRASES

    def measure(mode: str, level: str, concurrency: int) -> list[dict]:
        before = batches(url)
        engine_module.VERIFIED_TABLE_PHRASES = -1 if mode == "waiting" else joining
        try:
            replies, seconds = asyncio.run(run_level(url, modes[mode], concurrency))
        finally:
            engine_module.VERIFIED_TABLE_PHRASES = joining
        after = batches(url)
        levels[f"{mode} {level}"] = summary(replies, seconds, lone.get(mode, replies), lone.get("bare", replies)) | {
            "mean_batch": (after[0] - before[0]) / max(after[1] - before[1], 1)}
        print(f"{mode:8s} {level}: {json.dumps(levels[f'{mode} {level}'])}", flush=True)
        return replies

    try:
        for mode in modes:  # alone and first: the reference answers; what no earlier request encoded or read is here
            lone[mode] = measure(mode, "first", 1)
        if args.read_both:  # the first document's stored keys and values are the LM's own: the same answers
            levels["read-both first"]["equal_to_phrases"] = sum(
                both.get("text") == one.get("text") for both, one in zip(lone["read-both"], lone["phrases"]))
        paired = asyncio.run(run_paired(url, modes))  # then again, each prompt in every mode in turn
        for mode, replies in paired.items():
            seconds = sum(r["seconds"] for r in replies)
            levels[f"{mode} paired"] = summary(replies, seconds, lone[mode], lone["bare"]) | {
                "mean_batch": 1.0, "per_char_over_bare": per_char_over(replies, paired["bare"])}
            print(f"{mode:8s} paired: {json.dumps(levels[f'{mode} paired'])}", flush=True)
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            for mode in modes:
                measure(mode, f"c={concurrency}", concurrency)
        queue = asyncio.run(burst(url, 3 * args.max_queue))
        print(f"burst: {queue}")
    finally:
        server.should_exit = True
        thread.join(timeout=60)
    result = {"command": "python examples/benchmark_serving.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, device "
                         f"{engine.model.device}, load average {os.getloadavg()[0]:.1f} at the end",
              "model": engine.model_name, "prompts": len(prompts), "max_tokens": args.max_tokens,
              "levels": levels, "burst": queue}
    if args.output:
        write(Path(args.output), result)
    return result


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def write(folder: Path, result: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchmark.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = ["| run | answered | 5xx | rows per step | req/s | steps/s | p50 s | p95 s | first step p50 s "
            "| ms per character | over the bare LM's, paired median | equal to lone | the bare LM's text "
            "| retrieve / extract / encode p50 ms |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in result["levels"].items():
        rows.append(f"| {name} | {s['answered']}/{s['requests']} | {s['5xx']} | {s['mean_batch']:.1f} | {s['requests_per_s']:.2f} | "
                    f"{s['steps_per_s']:.1f} | {s['p50_s']:.2f} | {s['p95_s']:.2f} | {s['first_step_p50_s']:.3f} | "
                    f"{s['ms_per_char']:.2f} | {_ratio(s.get('per_char_over_bare'))} | "
                    f"{s['equal_to_lone']}/{s['answered']} | {s['bare_lm_text']}/{s['answered']} | "
                    + " / ".join(f"{s['stages_p50_ms'][k]:.0f}" for k in ("retrieve", "extract", "encode")) + " |")
    (folder / "benchmark.md").write_text(
        f"# dynvocab serve, load on loopback\n\n`{result['command']}`\n\n{result['machine']}; model {result['model']}; "
        f"{result['prompts']} held-out prompts, {result['max_tokens']} steps each, greedy.\n\n" + "\n".join(rows)
        + f"\n\nQueue burst: {json.dumps(result['burst'])}\n")


if __name__ == "__main__":
    main()
