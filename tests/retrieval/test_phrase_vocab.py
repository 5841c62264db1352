"""The phrase vocabulary: single-class pieces, fewest-token encodings, pruning to size, saving; BPE/Unigram baselines."""

import itertools

import pytest

from retrieval.phrase_vocab import (
    SPECIAL_TOKENS, PhraseVocabConfig, PhraseVocabulary, pieces, train_baseline,
)

DOCIDS = ["New York City", "New York Times", "New Zealand", "York Minster", "Apollo 11", "Apollo 13 (film)",
          "History of New York City", "History of Rome", "Rome", "Times Square"] * 3


def test_pieces_keep_one_character_class_and_join_back():
    assert pieces("Apollo 13 (film)") == ["Apollo", " 13", " (", "film", ")"]
    assert pieces("R2-D2's  x") == ["R", "2", "-", "D", "2", "'", "s", "  x"]
    for text in DOCIDS:
        assert "".join(pieces(text)) == text


def brute_fewest(vocab: PhraseVocabulary, text: str) -> int:
    """Fewest tokens by trying every token at every position (single characters, substrings of one piece,
    runs of whole pieces), top-down."""
    parts = pieces(text)
    starts = [sum(map(len, parts[:i])) for i in range(len(parts) + 1)]

    def options(i: int) -> list[int]:
        piece = max(k for k in range(len(parts)) if starts[k] <= i)
        ends = [i + 1] + [j for j in range(i + 2, starts[piece + 1] + 1) if text[i:j] in vocab.ids]
        if i in starts:
            ends += [starts[k] for k in range(piece + 2, len(parts) + 1) if text[i : starts[k]] in vocab.ids]
        return ends

    def fewest(i: int) -> int:
        return 0 if i == len(text) else min(1 + fewest(j) for j in options(i))

    return fewest(0)


def test_encodings_are_fewest_tokens_and_decode_back():
    vocab = PhraseVocabulary.train(DOCIDS, PhraseVocabConfig(size=60, min_count=2), show_progress_bar=False)
    assert vocab.vocab_size <= 60 and tuple(vocab.tokens[:3]) == SPECIAL_TOKENS
    for text in sorted(set(DOCIDS) | {"New Rome", "Zealand Times 11", "Romeo"}):
        ids = vocab.encode(text)
        assert vocab.decode(ids) == text
        assert len(ids) == brute_fewest(vocab, text)


def test_pruning_keeps_the_phrases_that_save_most():
    vocab = PhraseVocabulary.train(DOCIDS, PhraseVocabConfig(size=45, min_count=2), show_progress_bar=False)
    phrases = [t for t in vocab.tokens[3:] if len(t) > 1]
    assert "New York City" in vocab.ids  # frequent and long: it saves the most characters
    assert len(vocab.encode("History of New York City")) < len(pieces("History of New York City"))
    assert len(vocab.tokens) == 45 and len(phrases) == 45 - 3 - len({c for d in DOCIDS for c in d})


def test_unseen_characters_are_unknown():
    vocab = PhraseVocabulary.train(DOCIDS, PhraseVocabConfig(size=50), show_progress_bar=False)
    assert vocab.encode("Rome ☃")[-1] == vocab.unk_id


def test_save_and_load_round_trip(tmp_path):
    vocab = PhraseVocabulary.train(DOCIDS, PhraseVocabConfig(size=50), show_progress_bar=False)
    vocab.save(tmp_path / "vocab")
    again = PhraseVocabulary.load(tmp_path / "vocab")
    assert again.tokens == vocab.tokens and again.config == vocab.config
    (tmp_path / "vocab" / "vocab.json").write_text("[]")
    with pytest.raises(ValueError, match="vocab.json is corrupted"):
        PhraseVocabulary.load(tmp_path / "vocab")


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_baselines_share_the_special_ids_and_stay_within_size(kind):
    tokenizer = train_baseline(kind, DOCIDS, 60)
    assert tokenizer.vocab_size <= 60
    assert [tokenizer.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert all(ids for ids in tokenizer.encode_batch(["New York City", "Rome"]))
