"""Non-autoregressive generative retrieval (PIXAR): all docid tokens of a query predicted at once over a phrase
vocabulary, a shortlist head, and a trie-constrained beam search. An island: it imports nothing else of ``retrieval``."""

from .model import NarConfig, NarRetriever
from .training import NarTrainConfig, NarTrainer
from .trie import DocidTrie, beam_search
from .vocab import PhraseVocabConfig, PhraseVocabulary

__all__ = ["DocidTrie", "NarConfig", "NarRetriever", "NarTrainConfig", "NarTrainer", "PhraseVocabConfig",
           "PhraseVocabulary", "beam_search"]
