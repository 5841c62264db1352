import pytest

from dynvocab.io.jsonl import iter_jsonl


def test_values_come_with_their_line_numbers_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"a": 1}\n\n[2]\n"three"\n', encoding="utf-8")
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (3, [2]), (4, "three")]


def test_a_bad_line_is_named_with_the_fix(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 3}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"data.jsonl:2 is not valid JSON \(.*\); delete it"):
        list(iter_jsonl(path, fix="delete it"))


def test_a_last_line_cut_short_is_dropped_from_the_file_only_when_asked(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\r\n{"a": "é"}\n{"a": 3, "b', encoding="utf-8")
    with pytest.raises(ValueError, match="log.jsonl:3"):
        list(iter_jsonl(path))
    assert [value for _, value in iter_jsonl(path, drop_cut_last_line=True)] == [{"a": 1}, {"a": "é"}]
    assert path.read_bytes() == '{"a": 1}\r\n{"a": "é"}\n'.encode()


def test_a_bad_line_is_named_with_the_decoders_reason_and_the_default_fix(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"a": 1}\nnot json\n', encoding="utf-8")
    # the reason, without the decoder's "line 1 column 1": the line in the file is 2
    expected = r"data.jsonl:2 is not valid JSON \(Expecting value\); fix or remove that line$"
    with pytest.raises(ValueError, match=expected):
        list(iter_jsonl(path))
    path.write_bytes(b'{"a": 1}\n"caf\xe9"\n')  # Latin-1, not UTF-8
    with pytest.raises(ValueError, match=r"data.jsonl:2 is not valid JSON \('utf-8' codec can't decode byte 0xe9"):
        list(iter_jsonl(path))
