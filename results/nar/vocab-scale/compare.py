"""The phrase vocabulary builder before (7d3a0be, every round segments everything) and after the incremental pruning,
on the same docids: time and whether the tokens are the same.

    python results/nar/vocab-scale/compare.py 20000
"""
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from dynvocab.assets import wikipedia_leads  # noqa: E402
from retrieval import phrase_vocab as new  # noqa: E402

source = subprocess.run(["git", "-C", str(ROOT), "show", "7d3a0be:retrieval/phrase_vocab.py"], check=True,
                        capture_output=True, text=True).stdout
path = Path(tempfile.mkdtemp()) / "old_phrase_vocab.py"
path.write_text(source)
spec = importlib.util.spec_from_file_location("retrieval.old_phrase_vocab", path)
old = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = old
spec.loader.exec_module(old)
words = " ".join(d["text"] for d in wikipedia_leads()).split()
rng = random.Random(0)
docids = [" ".join(words[s : s + rng.randint(2, 6)]) for s in (rng.randrange(len(words) - 6) for _ in range(int(sys.argv[1])))]
titles = [d["title"] for d in wikipedia_leads()]
for name, texts in (("docids", docids), ("titles", titles)):
    out = {}
    for version, module in (("new", new), ("old", old)):
        began = time.perf_counter()
        tokens = module.PhraseVocabulary.train(texts, module.PhraseVocabConfig(size=8192), show_progress_bar=False).tokens
        out[version] = (time.perf_counter() - began, tokens)
    print(f"{name} ({len(texts)}): new {out['new'][0]:.1f} s, old {out['old'][0]:.1f} s, same tokens {out['new'][1] == out['old'][1]}",
          flush=True)
