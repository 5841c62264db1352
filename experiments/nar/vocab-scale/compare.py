"""The phrase vocabulary builder before (7d3a0be, every round segments everything) and after the incremental pruning,
on the same docids: time and whether the tokens are the same.

N docids (word windows of the Wikipedia leads, 2 to 6 words from a random start) and the leads' titles, each built
to 8,192 tokens by today's `retrieval.nar.vocab` and by the builder of 7d3a0be (loaded from git, so this needs the
repository's history). Prints one line per set; its output is in `results/nar/vocab-scale/run.log` (see that
folder's README.md).

    python experiments/nar/vocab-scale/compare.py 20000
"""
import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dynvocab.data.assets import wikipedia_leads
from retrieval.nar import vocab as new

ROOT = Path(__file__).resolve().parents[3]
BEFORE = "7d3a0be"  # the last commit whose builder segments everything every round (then at retrieval/phrase_vocab.py)


def old_builder(commit: str = BEFORE):
    """``retrieval/phrase_vocab.py`` as it was at ``commit``, imported from a temporary file."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:retrieval/phrase_vocab.py"], check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_phrase_vocab.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_phrase_vocab", path)
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # its dataclasses look their module up by name
    spec.loader.exec_module(old)
    return old


def compare(n: int) -> dict:
    """``{set name: {"new"|"old": (seconds, tokens)}}`` for ``n`` docids and the titles."""
    old = old_builder()
    words = " ".join(d["text"] for d in wikipedia_leads()).split()
    rng = random.Random(0)
    docids = [" ".join(words[s : s + rng.randint(2, 6)]) for s in (rng.randrange(len(words) - 6) for _ in range(n))]
    titles = [d["title"] for d in wikipedia_leads()]
    results = {}
    for name, texts in (("docids", docids), ("titles", titles)):
        out = results[name] = {}
        for version, module in (("new", new), ("old", old)):
            began = time.perf_counter()
            tokens = module.PhraseVocabulary.train(texts, module.PhraseVocabConfig(size=8192), show_progress_bar=False).tokens
            out[version] = (time.perf_counter() - began, tokens)
        print(f"{name} ({len(texts)}): new {out['new'][0]:.1f} s, old {out['old'][0]:.1f} s, same tokens {out['new'][1] == out['old'][1]}",
              flush=True)
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("n", type=int, metavar="N", help="docids to build from (the recorded run: 20000)")
    args = parser.parse_args(argv)
    return compare(args.n)


if __name__ == "__main__":
    main()
