"""A row's stream: text held back while it may be a stop string's start or half a character, cut at the stop."""

import threading

from dynvocab.serving.engine.rows import Row

#: id -> the text it decodes to (ids >= 100 are phrases); 9 is end-of-text
PIECES = {1: " the", 2: " cat", 3: " ST", 4: "OP here", 5: " \xe2", 6: "\x82\xac", 100: " on the mat"}


def decode(ids: list[int]) -> str:
    """Byte-level decoding: a character split over two ids shows as U+FFFD until its second half arrives."""
    raw = "".join(PIECES[i] for i in ids if i != 9).encode("latin-1")
    return raw.decode("utf-8", errors="replace")


def run(tokens: list[int], max_tokens: int = 10, stops=(), cancel_at: int | None = None) -> tuple[Row, list]:
    heard = []
    row = Row(max_tokens, list(stops), lambda text, phrase: heard.append((text, phrase)), threading.Event())
    for step, token in enumerate(tokens):
        if step == cancel_at:
            row.cancelled.set()
        if not row.done:
            row.step(token, decode, {9}, vocab_size=100)
    return row, heard


def test_a_stop_string_split_over_steps_is_never_streamed():
    row, heard = run([1, 3, 4, 2], stops=["STOP"])
    assert row.text == " the " and row.finish_reason == "stop" and row.ids == [1, 3, 4]
    assert "".join(text for text, _ in heard) == " the "  # " ST" was held back, then cut


def test_a_half_character_waits_for_its_second_half():
    row, heard = run([1, 5, 6])
    assert [text for text, _ in heard] == [" the", " ", "€"]  # U+FFFD of the half character was never sent
    assert row.text == " the €" and row.finish_reason is None


def test_a_phrase_is_one_step_with_its_index_and_the_row_ends_at_its_limit_or_end_of_text():
    row, heard = run([100, 2, 1], max_tokens=2)
    assert heard == [(" on the mat", 0), (" cat", None)] and row.finish_reason == "length" and row.ids == [100, 2]
    row, _ = run([1, 9, 2])
    assert row.finish_reason == "stop" and row.ids == [1, 9] and row.text == " the"


def test_a_cancelled_row_stops():
    row, heard = run([1, 2, 1], cancel_at=1)
    assert row.finish_reason == "cancelled" and row.ids == [1] and len(heard) == 1
