from __future__ import annotations

import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from dynvocab import Phrase
from retrieval import extract_phrases

DOCUMENTS = [
    {
        "id": "eiffel",
        "text": "The Eiffel Tower is a wrought-iron lattice tower in Paris. It was unbelievably tall for its time "
        "(completed in 1889), and the Eiffel Tower is still a symbol of Paris.\nVisitors climb it every day.",
    },
    {
        "id": "louvre",
        "text": "The Louvre is an art museum in Paris, France. Berlin has museums too. The U.S. Army's "
        'band played "La Marseillaise" there.',
    },
]


def _texts() -> dict[str, str]:
    return {d["id"]: d["text"] for d in DOCUMENTS}


def _occurrences(phrase: str, texts: dict[str, str]):
    for doc_id, text in texts.items():
        for match in re.finditer(re.escape(phrase), text):
            yield doc_id, text, match.start(), match.end()


def _assert_on_word_boundaries(phrases: list[Phrase], texts: dict[str, str]) -> None:
    """Every phrase occurs in its source document, starting and ending on a word boundary.

    A token phrase may start with the one space its first token carries.
    """
    for phrase in phrases:
        core = phrase.text.removeprefix(" ")
        spans = [(t, s, e) for doc_id, t, s, e in _occurrences(core, texts) if doc_id == phrase.source]
        assert spans, f"{phrase} is not in its source"
        assert any(
            (s == 0 or not t[s - 1].isalnum()) and (e == len(t) or not t[e].isalnum()) for t, s, e in spans
        ), f"{phrase} cuts a word"
        assert core == core.strip() and core[0].isalnum() and core[-1] not in ",;:", phrase


def test_gpt2_phrases_respect_word_boundaries(tokenizer):
    phrases = extract_phrases(DOCUMENTS, tokenizer)
    _assert_on_word_boundaries(phrases, _texts())
    texts = {p.text.strip() for p in phrases}
    assert {"The Eiffel Tower", "Eiffel Tower", "lattice tower in Paris", "The U.S. Army's"} <= texts
    # "Louvre" and "Marseillaise" are several GPT-2 tokens: a phrase holds them whole or not at all.
    assert len(tokenizer.tokenize(" Louvre")) > 1 and len(tokenizer.tokenize(" Marseillaise")) > 1
    assert {"The Louvre", "La Marseillaise"} <= texts
    assert not any(re.search(r"Lou(?!vre)|(?<!Lou)vre|Marse(?!illaise)|(?<!Marse)illa", t) for t in texts)


def test_phrases_are_two_to_eight_tokens(tokenizer):
    phrases = extract_phrases(DOCUMENTS, tokenizer, min_length=2, max_length=3)
    for phrase in phrases:
        # In context a phrase is tokenised with or without the space before it.
        lengths = {len(tokenizer.tokenize(phrase.text)), len(tokenizer.tokenize(" " + phrase.text))}
        assert any(2 <= n <= 3 for n in lengths), phrase


def test_punctuation_and_stopword_only_phrases_are_dropped(tokenizer):
    texts = {p.text.strip() for p in extract_phrases(DOCUMENTS, tokenizer)}
    for junk in ("It was", "is a", "in the", "for its", ", and", "and the", "It"):
        assert junk not in texts
    assert "for its time" in texts  # one content word is enough
    texts = {p.text.strip() for p in extract_phrases(DOCUMENTS, tokenizer, stopwords=None)}
    assert "It was" in texts


def test_phrases_stay_inside_sentences_and_brackets(tokenizer):
    texts = {p.text.strip() for p in extract_phrases(DOCUMENTS, tokenizer)}
    assert not any(". Berlin" in t or "\n" in t or "Paris. It" in t for t in texts)
    assert "The U.S. Army's band" in texts  # an abbreviation's period does not end the sentence
    for text in texts:
        assert text.count("(") == text.count(")") and text.count('"') % 2 == 0, text
    assert 'played "La Marseillaise" there' in texts and 'played "La' not in texts
    joined = {p.text.strip() for p in extract_phrases(DOCUMENTS, tokenizer, split_sentences=False)}
    assert "France. Berlin" in joined


def test_ranking_counts_cap_and_sources():
    documents = [
        {"id": "d1", "text": "green tea is good. green tea is cheap."},
        {"id": "d2", "text": "black tea is good. green tea helps."},
    ]
    phrases = extract_phrases(documents, unit="words", max_length=3)
    # "green tea" and "tea is" are both seen 3 times; "green tea" was seen first.
    assert phrases[:2] == [Phrase("green tea", "d1"), Phrase("tea is", "d1")]
    assert {p.text for p in phrases[2:5]} == {"green tea is", "tea is good", "is good"}
    by_text = {p.text: p for p in phrases}
    assert by_text["black tea"].source == "d2" and by_text["tea helps"].source == "d2"
    assert by_text["tea is cheap"].source == "d1"
    assert extract_phrases(documents, unit="words", max_length=3, max_phrases=2) == phrases[:2]
    assert extract_phrases(documents, unit="words", max_length=3, min_count=3) == phrases[:2]
    assert extract_phrases(documents, unit="words", max_phrases=0) == []


def test_token_phrases_keep_the_space_their_first_token_carries(tokenizer):
    document = "Green tea is good. I like green tea and Green tea."
    phrases = extract_phrases([document], tokenizer)
    # "Green tea" opens the document (no space); " green tea" and " Green tea" are other token sequences.
    assert {"Green tea", " green tea", " Green tea"} <= {p.text for p in phrases}
    in_context = tokenizer.tokenize(document)
    for phrase in phrases:  # each phrase re-tokenises to the very tokens it covers in the document
        tokens = tokenizer.tokenize(phrase.text)
        assert any(in_context[i : i + len(tokens)] == tokens for i in range(len(in_context))), phrase
    assert not any(p.text.startswith("  ") or p.text.startswith("\n") for p in phrases)
    assert all(not p.text.startswith(" ") for p in extract_phrases(DOCUMENTS, unit="words"))


def test_plain_strings_are_named_by_rank(tokenizer):
    phrases = extract_phrases(["alpha beta gamma", "delta epsilon and alpha beta"], tokenizer)
    by_text = {p.text: p.source for p in phrases}
    assert by_text["alpha beta"] == "0" and by_text["delta epsilon"] == "1" and by_text[" alpha beta"] == "1"


@pytest.fixture(scope="module")
def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    return _sentencepiece_tokenizer()


def _sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A Llama-style tokenizer: SentencePiece '▁' pre-tokenisation, BPE with byte fallback, trained here."""
    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    corpus = [d["text"] for d in DOCUMENTS] * 5 + ["The tower of Paris is tall and the tower is old."] * 5
    backend.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=420, special_tokens=specials))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_sentencepiece_style_tokenizer(sentencepiece_tokenizer):
    documents = DOCUMENTS + [{"id": "cafe", "text": "Paris café culture. Le café au lait est bon."}]
    tokens = sentencepiece_tokenizer.tokenize(documents[0]["text"])
    assert tokens[0] == "▁" or tokens[0].startswith("▁")  # the prepended space marker
    phrases = extract_phrases(documents, sentencepiece_tokenizer)
    _assert_on_word_boundaries(phrases, {d["id"]: d["text"] for d in documents})
    texts = {p.text.strip() for p in phrases}
    assert "The Eiffel Tower" in texts  # the document's first word, after the '▁' marker
    assert {"Paris café", "café au"} <= texts
    # "▁Paris ▁ c a f <0xC3> <0xA9>": 'é' is two byte-fallback tokens sharing one character;
    # a phrase never ends between them.
    def texts_up_to(n: int) -> set[str]:
        return {p.text.strip() for p in extract_phrases(documents[2:], sentencepiece_tokenizer, max_length=n)}

    assert "Paris café" not in texts_up_to(6) and "Paris café" in texts_up_to(7)


def test_words_unit_needs_no_tokenizer():
    phrases = extract_phrases(DOCUMENTS, unit="words", min_length=2, max_length=2)
    _assert_on_word_boundaries(phrases, _texts())
    assert all(len(p.text.split()) == 2 for p in phrases if "-" not in p.text)
    assert Phrase("Eiffel Tower", "eiffel") in phrases


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"unit": "chars"}, ValueError, "unit='chars'"),
        ({"unit": "tokens", "tokenizer": None}, ValueError, "needs the LM's tokenizer"),
        ({"unit": "words", "min_length": 3, "max_length": 2}, ValueError, "min_length=3"),
        ({"unit": "words", "min_count": 0}, ValueError, "min_count=0"),
        ({"unit": "words", "max_phrases": -1}, ValueError, "max_phrases=-1"),
    ],
)
def test_bad_arguments_raise(kwargs, error, message):
    with pytest.raises(error, match=message):
        extract_phrases(DOCUMENTS, **kwargs)


def test_bad_documents_raise():
    with pytest.raises(TypeError, match="wrap it in a list"):
        extract_phrases("just one text", unit="words")
    with pytest.raises(TypeError, match=r"documents\[0\]"):
        extract_phrases([{"body": "x"}], unit="words")


@pytest.mark.slow
def test_real_wikipedia_leads(tokenizer):
    from dynvocab.data.assets import wikipedia_leads

    leads = wikipedia_leads()[:32]
    phrases = extract_phrases(leads, tokenizer)
    _assert_on_word_boundaries(phrases[:2000], {d["id"]: d["text"] for d in leads})
    assert len(phrases) > 1000 and {p.source for p in phrases} <= {d["id"] for d in leads}


def test_a_document_is_cut_once_and_its_phrases_stay_what_a_fresh_cut_gives(tokenizer, monkeypatch):
    from retrieval import phrases

    settings = {"unit": "tokens", "edges": "content", "ranking": "relevance", "max_phrases": 50}
    monkeypatch.setattr(phrases, "_NGRAM_COUNTS", phrases._DocumentNgrams())
    first = extract_phrases(DOCUMENTS, tokenizer, **settings)
    cut = []
    token_units = phrases._token_units
    monkeypatch.setattr(phrases, "_token_units", lambda text, *rest: cut.append(text) or token_units(text, *rest))
    swapped = [DOCUMENTS[1], {"id": "new", "text": "The Seine flows through Paris."}, DOCUMENTS[0]]
    again = extract_phrases(swapped, tokenizer, **settings)
    assert cut == ["The Seine flows through Paris."]  # only the document not seen before is cut
    monkeypatch.setattr(phrases, "_NGRAM_COUNTS", phrases._DocumentNgrams())
    assert again == extract_phrases(swapped, tokenizer, **settings)  # ranks and sources as from a fresh cut
    assert extract_phrases(DOCUMENTS, tokenizer, **settings | {"max_length": 3}) != first  # other settings: cut anew
    words = extract_phrases(DOCUMENTS, unit="words", max_phrases=50)
    assert words == extract_phrases(DOCUMENTS, unit="words", max_phrases=50) != first


def test_the_cut_documents_kept_stay_under_their_bound(tokenizer):
    from retrieval import phrases

    kept = phrases._DocumentNgrams(limit=60)
    cache = kept.of(tokenizer)
    for number in range(5):
        cache.put((f"document {number}", ()), phrases.Counter({f"phrase {number} {i}": 1 for i in range(25)}))
    assert cache.size <= 60 and cache.get(("document 4", ())) is not None and cache.get(("document 0", ())) is None
    cache.get(("document 3", ()))  # used: the older document 4 leaves first
    cache.put(("document 5", ()), phrases.Counter({f"another {i}": 1 for i in range(25)}))
    assert cache.get(("document 4", ())) is None and cache.get(("document 3", ())) is not None
