"""Two probes of a served request's time before its first step (docs/serving.md, "Load benchmark"), on the served
model and Wikipedia index, each arm paired and alternating over the same held-out prompts:

* ``tokenize``: cutting a request's phrases (`PhrasePipeline.candidates`), the context gate and `set_phrases`, with the
  phrase table remembering token ids (`PhraseTable.tokenize`) against tokenizing at each of the three (memo size 0);
* ``prefill``: time to the first step with the bare prefill run in a second thread while the request retrieves and
  cuts its phrases, against the same work in turn, and the bare LM's first step.

    HF_HUB_OFFLINE=1 python experiments/serving/request_probes.py tokenize
    HF_HUB_OFFLINE=1 python experiments/serving/request_probes.py prefill
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe", choices=("tokenize", "prefill"))
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--retrieve", type=int, default=4, help="documents each request retrieves")
    args = parser.parse_args(argv)
    from dynvocab.serving.config import ServerConfig
    from dynvocab.serving.http.server import load_engine
    from evals.protocol import EvalConfig, held_out_prompts

    engine = load_engine(ServerConfig())
    index = engine.corpora["wikipedia"]
    prompts = [p["prompt"] for p in held_out_prompts(engine.model.tokenizer, EvalConfig(num_prompts=args.num_prompts))]
    probe = tokenize_probe if args.probe == "tokenize" else prefill_probe
    probe(engine.model, index, prompts, args.retrieve)


def _paired(arms: dict, items: list, warmup: int = 2) -> dict[str, float]:
    """Median ms of each arm over ``items``, the arms' order alternating item by item; the first ``warmup`` left out."""
    times = {name: [] for name in arms}
    for i, item in enumerate(items):
        for name in list(arms)[:: 1 if i % 2 else -1]:
            times[name].append(arms[name](item))
    return {name: 1000 * statistics.median(values[warmup:]) for name, values in times.items()}


def tokenize_probe(model, index, prompts: list[str], k: int) -> None:
    import dynvocab.phrases.table as phrase_table
    from retrieval.config import PipelineConfig
    from retrieval.pipeline import PhrasePipeline

    documents = [index.search_documents([prompt], k=k)[0] for prompt in prompts]
    for gate in (0, 4):
        pipeline = PhrasePipeline(model, None, PipelineConfig(top_k=k, context_tokens=gate))

        def arm(memo_size: int):
            def run(found: list[dict]) -> float:
                phrase_table.TOKEN_MEMO_SIZE = memo_size
                model.phrase_table._token_memo.clear()  # a request's own phrases only, nothing from the one before
                start = time.perf_counter()
                phrases = pipeline.candidates(found)
                pipeline.phrase_contexts(found, phrases)
                model.set_phrases(phrases, mid_sentence_forms=False)
                return time.perf_counter() - start
            return run

        ms = _paired({"remembered": arm(65536), "each time": arm(0)}, documents)
        print(f"context_tokens={gate}: candidates + contexts + set_phrases, median ms "
              f"{ {name: round(value, 1) for name, value in ms.items()} }, ratio {ms['remembered'] / ms['each time']:.3f}")


@torch.no_grad()
def prefill_probe(model, index, prompts: list[str], k: int) -> None:
    from transformers import DynamicCache

    from retrieval.config import PipelineConfig
    from retrieval.pipeline import PhrasePipeline

    settings = PipelineConfig(top_k=k, no_repeat_ngram_size=0)
    pipeline, tokenizer = PhrasePipeline(model, None, settings), model.tokenizer

    def prepare(prompt: str) -> None:
        model.set_phrases(pipeline.candidates(index.search_documents([prompt], k=k)[0]), mid_sentence_forms=False)

    def first_step(ids: torch.Tensor, **cache) -> None:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, **cache, **settings.generation_kwargs())

    def in_turn(prompt: str) -> float:
        start = time.perf_counter()
        prepare(prompt)
        first_step(torch.tensor([tokenizer(prompt).input_ids]))
        return time.perf_counter() - start

    def overlapped(prompt: str) -> float:
        start = time.perf_counter()
        ids, cache = torch.tensor([tokenizer(prompt).input_ids]), DynamicCache()

        def prefill() -> None:
            with torch.no_grad():
                model.lm(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)

        worker = threading.Thread(target=prefill)
        worker.start()
        prepare(prompt)
        worker.join()
        first_step(ids, past_key_values=cache)
        return time.perf_counter() - start

    def bare(prompt: str) -> float:
        start = time.perf_counter()
        ids = torch.tensor([tokenizer(prompt).input_ids])
        model.lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False)
        return time.perf_counter() - start

    ms = _paired({"in turn": in_turn, "overlapped": overlapped, "bare": bare}, prompts * 3)
    print(f"first step, median ms { {name: round(value, 1) for name, value in ms.items()} }; in turn / bare "
          f"{ms['in turn'] / ms['bare']:.3f}, overlapped / bare {ms['overlapped'] / ms['bare']:.3f}")


if __name__ == "__main__":
    main()
