"""PhraseVocabulary.train time against the number of docids (word windows of the leads as docids).

For each N: N docids of 2 to 6 words from a random start in the Wikipedia leads, built to a vocabulary of
max(8,192, N / 8). Prints one line per N (docids, words in the leads, seconds, vocabulary size); its output is in
`results/nar/vocab-scale/run.log`, read in that folder's README.md (peak memory from `/usr/bin/time -v`).

    python experiments/nar/vocab-scale/scale.py 20000 100000 1000000
"""
import argparse
import random
import time

from dynvocab.data.assets import wikipedia_leads
from retrieval.nar.vocab import PhraseVocabConfig, PhraseVocabulary


def scale(sizes: list[int]) -> list[tuple[int, float, int]]:
    """``(docids, seconds, vocabulary size)`` per size, one random stream of windows over all sizes."""
    words = " ".join(d["text"] for d in wikipedia_leads()).split()
    rng = random.Random(0)
    rows = []
    for n in sizes:
        docids = [" ".join(words[s : s + rng.randint(2, 6)]) for s in (rng.randrange(len(words) - 6) for _ in range(n))]
        began = time.perf_counter()
        vocab = PhraseVocabulary.train(docids, PhraseVocabConfig(size=max(8192, n // 8)), show_progress_bar=False)
        seconds = time.perf_counter() - began
        print(n, "docids", len(words), "words", f"{seconds:.1f} s", vocab.vocab_size, flush=True)
        rows.append((n, seconds, vocab.vocab_size))
    return rows


def main(argv=None) -> list[tuple[int, float, int]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", type=int, nargs="+", metavar="N", help="numbers of docids, built in this order")
    args = parser.parse_args(argv)
    return scale(args.sizes)


if __name__ == "__main__":
    main()
