"""PhraseVocabulary.train time against the number of docids (word windows of the leads as docids)."""
import random, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from dynvocab.assets import wikipedia_leads
from retrieval.phrase_vocab import PhraseVocabConfig, PhraseVocabulary
words = " ".join(d["text"] for d in wikipedia_leads()).split()
rng = random.Random(0)
for n in map(int, sys.argv[1:]):
    docids = [" ".join(words[s : s + rng.randint(2, 6)]) for s in (rng.randrange(len(words) - 6) for _ in range(n))]
    began = time.perf_counter()
    vocab = PhraseVocabulary.train(docids, PhraseVocabConfig(size=max(8192, n // 8)), show_progress_bar=False)
    print(n, "docids", len(words), "words", f"{time.perf_counter() - began:.1f} s", vocab.vocab_size, flush=True)
