from types import SimpleNamespace

from dynvocab.cli.demo import summarize


def test_the_summary_compares_time_per_character_written(capsys):
    # same steps on both sides: dynamic writes 200 characters in 2 s, the bare LM 100 characters in 1.5 s
    dynamic = SimpleNamespace(steps=10, phrase_steps=4, text="x" * 200, latency={"encode": 0.5, "decode": 1.5},
                              cited_share=0.25)
    bare = {"steps": 10, "text": "y" * 100, "seconds": 1.5}
    summarize([(dynamic, bare)])
    out = capsys.readouterr().out
    assert "phrase steps: 4/10 (40.0%); cited: 25% of the characters" in out
    assert "characters per step: dynamic 20.00, bare LM 10.00" in out
    assert "ms per character written: dynamic 10.00 (everything included), bare LM 15.00 (0.67x)" in out


def test_a_grounded_summary_names_its_mode(capsys):
    grounded = SimpleNamespace(steps=10, phrase_steps=0, text="x" * 200, latency={"decode": 2.0}, cited_share=0.5,
                               grounded=True)
    summarize([(grounded, {"steps": 10, "text": "y" * 100, "seconds": 1.5})])
    out = capsys.readouterr().out
    assert "characters per step: grounded 20.00" in out and "ms per character written: grounded 10.00" in out
