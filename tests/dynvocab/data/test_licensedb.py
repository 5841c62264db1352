"""ScanCode LicenseDB: the reader (front matter off the text, kept as metadata), the two held-out splits by licence
family, and the leak check that every report prints."""

import pytest

from dynvocab.data.assets import read_licensedb
from dynvocab.data.corpora import licence_family, split_licensedb
from evals.leakage import leak_check, verbatim_share

WORDS = " ".join(f"word{i}" for i in range(160))  # long enough to be a prompt (150 words)


def write_db(folder, licences: dict[str, dict], rules: dict[str, str]) -> None:
    (folder / "licenses").mkdir(parents=True)
    (folder / "rules").mkdir()
    for key, extra in licences.items():
        front = "".join(f"{name}: {value}\n" for name, value in {"key": key, "short_name": key.upper(), **extra}.items())
        (folder / "licenses" / f"{key}.LICENSE").write_text(f"---\n{front}---\n\n{key} text {WORDS}\n")
    for name, expression in rules.items():
        (folder / "rules" / f"{name}.RULE").write_text(f"---\nlicense_expression: {expression}\nis_license_notice: yes\n"
                                                       f"---\n\nLicensed under {expression}.\n")


@pytest.fixture
def database(tmp_path):
    licences = {f"bsd-{v}": {"category": "Permissive"} for v in ("new", "simplified", "original", "zero", "plus", "two")}
    licences |= {f"gpl-{v}": {"category": "Copyleft"} for v in ("1.0", "2.0", "3.0")}
    licences |= {f"solo{i}": {"category": "Permissive"} for i in range(8)}
    licences |= {"gpl-old": {"is_deprecated": "yes"}, "mit": {"category": "Permissive", "owner": "MIT"}}
    write_db(tmp_path, licences, {"mit_1": "mit", "gpl_2": "gpl-2.0 OR mit", "bsd_3": "bsd-new AND solo3"})
    return read_licensedb(tmp_path)


def test_the_reader_keeps_the_front_matter_as_metadata_and_the_text_without_it(database):
    mit = next(d for d in database if d["id"] == "mit")
    assert mit["text"].startswith("mit text word0") and "---" not in mit["text"] and "owner" not in mit["text"]
    assert mit["metadata"] == {"key": "mit", "short_name": "MIT", "category": "Permissive", "owner": "MIT"}
    assert (mit["kind"], mit["title"]) == ("license", "MIT")
    rule = next(d for d in database if d["id"] == "rule:gpl_2")
    assert (rule["kind"], rule["title"], rule["text"]) == ("rule", "gpl-2.0 OR mit", "Licensed under gpl-2.0 OR mit.")
    assert rule["metadata"]["is_license_notice"] is True
    assert [d["kind"] for d in database] == ["license"] * 19 + ["rule"] * 3  # licences first, each kind by name


def test_a_family_is_the_first_part_of_the_key():
    assert [licence_family(k) for k in ("bsd-new", "gpl-2.0-plus", "cc_by_4", "mit")] == ["bsd", "gpl", "cc", "mit"]


def test_variants_hold_out_a_third_of_each_big_family_and_keep_their_twins_indexed(database):
    indexed, held_out = split_licensedb(database, "variants")
    held = {d["id"] for d in held_out}
    assert split_licensedb(database, "variants") == (indexed, held_out)  # fixed
    assert {licence_family(k) for k in held} == {"bsd", "gpl"} and len(held) == 2 + 1  # 6 // 3 and 3 // 3
    in_index = {d["id"] for d in indexed}
    assert not held & in_index
    for key in held:  # at least two of its family stay indexed
        assert sum(licence_family(k) == licence_family(key) for k in in_index) >= 2
    assert "gpl-old" in in_index  # deprecated: never a prompt, still indexed
    rules = {d["id"] for d in indexed if d["kind"] == "rule"}
    assert ("rule:gpl_2" in rules) == ("gpl-2.0" not in held) and ("rule:bsd_3" in rules) == ("bsd-new" not in held)


def test_new_families_hold_out_whole_families(database, monkeypatch):
    from dynvocab.data import corpora

    monkeypatch.setattr(corpora, "LICENSEDB_FAMILY_HELD_OUT", 5)
    indexed, held_out = split_licensedb(database, "families")
    families = {licence_family(d["id"]) for d in held_out}
    assert sum(len(d["text"]) > 0 for d in held_out) >= 5
    indexed_families = {licence_family(d["id"]) for d in indexed if d["kind"] == "license"}
    assert not families & indexed_families  # no member of a held-out family in the index, deprecated ones included
    for rule in (d for d in indexed if d["kind"] == "rule"):
        assert not {licence_family(k) for k in rule["title"].lower().replace(" or ", " ").split()} & families


def test_a_bad_split_name_is_refused(database):
    with pytest.raises(ValueError, match=r"how='random'; choose one of \('variants', 'families'\)"):
        split_licensedb(database, "random")


def test_the_leak_check_finds_references_standing_verbatim_in_the_index():
    documents = ["The licensee may   copy the work\nand share it.", "Another text entirely."]
    references = ["may copy the work and share it.", "copy the work and sell it.", "Another text"]
    assert verbatim_share(references, documents) == pytest.approx(2 / 3)
    assert verbatim_share(["copy the work and sell it."], documents, words=4) == 1.0  # its first four words are there
    assert verbatim_share(["it. Another"], documents) == 0.0  # never across two documents
    assert leak_check(references, documents) == {"references": 3, "whole": pytest.approx(2 / 3),
                                                   "first_32_words": pytest.approx(2 / 3)}


@pytest.mark.slow
def test_each_real_split_holds_out_at_least_200_licences():
    from dynvocab.data.corpora import corpus_split

    for name in ("licensedb", "licensedb-families"):
        indexed, held_out = corpus_split(name)
        assert len(held_out) >= 200 and not {d["id"] for d in held_out} & {d["id"] for d in indexed}
