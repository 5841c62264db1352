"""Fault injection on the one directory swap: a save interrupted at any step leaves a complete copy that loads."""

import copy
import errno
import os

import pytest
import torch

from dynvocab import DynamicVocabLM
from dynvocab.io import atomic
from dynvocab.io.atomic import MANIFEST, atomic_directory, read_manifest, recover, verify


def write(directory, text):
    (directory / "payload.txt").write_text(text)
    (directory / "sub").mkdir()
    (directory / "sub" / "more.txt").write_text(text * 2)


def test_a_save_writes_its_manifest_last_and_it_checks(tmp_path):
    with atomic_directory(tmp_path / "out") as staging:
        write(staging, "one")
    assert set(read_manifest(tmp_path / "out")) == {"payload.txt", "sub/more.txt"}
    verify(tmp_path / "out")
    (tmp_path / "out" / "sub" / "more.txt").write_text("edited")
    with pytest.raises(ValueError, match="more.txt does not match"):
        verify(tmp_path / "out")


def test_files_the_library_did_not_write_are_kept_across_saves(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "notes.md").write_text("mine")
    (target / "data").mkdir()
    (target / "data" / "corpus.txt").write_text("my corpus")
    for text in ("one", "two"):
        with atomic_directory(target) as staging:
            write(staging, text)
    assert (target / "notes.md").read_text() == "mine"
    assert (target / "data" / "corpus.txt").read_text() == "my corpus"
    assert (target / "payload.txt").read_text() == "two"
    assert "notes.md" not in read_manifest(target)


def test_a_save_that_would_overwrite_a_user_file_is_refused_and_changes_nothing(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "payload.txt").write_text("the user's own")
    with pytest.raises(ValueError, match="payload.txt is not a file an earlier dynvocab save wrote"):
        with atomic_directory(target) as staging:
            write(staging, "one")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert (target / "payload.txt").read_text() == "the user's own"


def test_a_body_that_raises_leaves_the_old_copy(tmp_path):
    with atomic_directory(tmp_path / "out") as staging:
        write(staging, "one")
    with pytest.raises(RuntimeError):
        with atomic_directory(tmp_path / "out") as staging:
            write(staging, "two")
            raise RuntimeError("disk full")
    assert (tmp_path / "out" / "payload.txt").read_text() == "one"
    assert sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize("failing_calls", [{1}, {2}, {2, 3}], ids=["set-aside", "swap-in", "swap-in-and-roll-back"])
def test_os_replace_failing_at_each_step_of_the_swap_keeps_a_complete_copy(tmp_path, monkeypatch, failing_calls):
    with atomic_directory(tmp_path / "out") as staging:
        write(staging, "one")
    real_replace, calls = os.replace, []

    def flaky_replace(source, destination):
        calls.append((source, destination))
        if len(calls) in failing_calls:
            raise OSError("injected failure")
        return real_replace(source, destination)

    monkeypatch.setattr(atomic.os, "replace", flaky_replace)
    with pytest.raises(OSError, match="injected"):
        with atomic_directory(tmp_path / "out") as staging:
            write(staging, "two")
    monkeypatch.setattr(atomic.os, "replace", real_replace)
    recover(tmp_path / "out")
    verify(tmp_path / "out")
    assert (tmp_path / "out" / "payload.txt").read_text() == "one"
    assert sorted(os.listdir(tmp_path)) == ["out"]


def _killed_between_the_renames(tmp_path, new_copy_finished: bool):
    """The state a kill -9 leaves after ``target -> retired`` and before ``staging -> target``."""
    with atomic_directory(tmp_path / "out") as staging:
        write(staging, "old")
    with atomic_directory(tmp_path / "new") as staging:
        write(staging, "new")
    if not new_copy_finished:
        (tmp_path / "new" / MANIFEST).unlink()
    os.replace(tmp_path / "new", tmp_path / ".out.dynvocab-staging-abc")
    os.replace(tmp_path / "out", tmp_path / ".out.dynvocab-retired-abc")


@pytest.mark.parametrize(("new_copy_finished", "expected"), [(True, "new"), (False, "old")])
def test_a_kill_between_the_two_renames_is_recovered_by_the_next_load(tmp_path, new_copy_finished, expected):
    _killed_between_the_renames(tmp_path, new_copy_finished)
    assert not (tmp_path / "out").exists()
    recover(tmp_path / "out")
    verify(tmp_path / "out")
    assert (tmp_path / "out" / "payload.txt").read_text() == expected
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_from_pretrained_recovers_a_model_save_killed_mid_swap(llama, tokenizer, tmp_path):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.save_pretrained(tmp_path / "model")
    os.replace(tmp_path / "model", tmp_path / ".model.dynvocab-retired-xyz")
    loaded = DynamicVocabLM.from_pretrained(tmp_path / "model", copy.deepcopy(llama), tokenizer)
    for name, tensor in model.phrase_encoder.trainable_state_dict().items():
        assert torch.equal(loaded.phrase_encoder.trainable_state_dict()[name], tensor)


def test_save_pretrained_keeps_the_users_other_files(llama, tokenizer, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "README.md").write_text("my notes")
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.save_pretrained(tmp_path / "model")
    model.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "README.md").read_text() == "my notes"


def test_a_folder_being_deleted_is_never_restored(tmp_path):
    with atomic_directory(tmp_path / "out") as staging:
        write(staging, "old")
    atomic.remove_directory(tmp_path / "out")
    assert os.listdir(tmp_path) == []
    # a kill during the deletion leaves a renamed, half-deleted folder: the next recover removes it, never restores it
    (tmp_path / ".out.dynvocab-deleting-123").mkdir()
    (tmp_path / ".out.dynvocab-deleting-123" / "payload.txt").write_text("half")
    recover(tmp_path / "out")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "content",
    ["[]", '{"format": "dynvocab.manifest", "files": []}', '{"format": "other", "files": {}}'],
    ids=["not-an-object", "files-not-an-object", "another-format"],
)
def test_a_manifest_that_is_not_ours_is_refused_naming_the_file(tmp_path, content):
    with atomic_directory(tmp_path / "out") as staging:
        write(staging, "one")
    (tmp_path / "out" / MANIFEST).write_text(content)
    with pytest.raises(ValueError, match=f"out/{MANIFEST} is not a dynvocab manifest; save the folder again"):
        verify(tmp_path / "out")


def test_a_file_that_fails_verification_is_named_with_how_to_fix_it(tmp_path):
    with atomic_directory(tmp_path / "out") as staging:
        write(staging, "one")
    (tmp_path / "out" / "payload.txt").write_text("two")
    fix = ("the file was edited, truncated or corrupted after it was saved; restore it or save the folder again "
           r"\(an edit made on purpose, e.g. to a config: load with verify=False\)")
    with pytest.raises(ValueError, match=f"payload.txt does not match .*: {fix}$"):
        verify(tmp_path / "out")
    (tmp_path / "out" / "payload.txt").unlink()
    with pytest.raises(ValueError, match=f"payload.txt is missing though {MANIFEST} lists it; {fix}$"):
        verify(tmp_path / "out")


def test_user_files_are_copied_over_where_hard_links_are_refused(tmp_path, monkeypatch):
    target = tmp_path / "out"
    (target / "data").mkdir(parents=True)
    (target / "notes.md").write_text("mine")
    (target / "data" / "corpus.txt").write_text("my corpus")

    def no_hard_links(source, destination):
        raise OSError("hard links are not supported here")  # a FAT or network drive, or another device

    monkeypatch.setattr(atomic.os, "link", no_hard_links)
    with atomic_directory(target) as staging:
        write(staging, "one")
    assert (target / "notes.md").read_text() == "mine"
    assert (target / "data" / "corpus.txt").read_text() == "my corpus"
    assert (target / "payload.txt").read_text() == "one"


def _save(path, text):
    with atomic_directory(path) as staging:
        write(staging, text)


def _undeletable(monkeypatch, name):
    """Make every file called ``name`` refuse deletion, as one another process holds open (Windows, NFS) does."""
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.path.basename(os.fsdecode(path)) == name:
            raise PermissionError(errno.EACCES, "the file is in use by another process", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)


@pytest.mark.parametrize("leftover", ["staging", "retired"])
def test_recover_restores_the_newest_of_several_complete_copies(tmp_path, leftover):
    # two interrupted saves left two complete copies beside a missing folder; the name order contradicts the age order
    for text, suffix, mtime in [("older", "zzz", 1_000_000_000), ("newer", "aaa", 2_000_000_000)]:
        _save(tmp_path / text, text)
        folder = tmp_path / f".out.dynvocab-{leftover}-{suffix}"
        os.replace(tmp_path / text, folder)
        os.utime(folder, (mtime, mtime))
    recover(tmp_path / "out")
    verify(tmp_path / "out")
    assert (tmp_path / "out" / "payload.txt").read_text() == "newer"
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_save_over_an_old_copy_leaves_only_the_new_copy(tmp_path):
    _save(tmp_path / "out", "one")
    _save(tmp_path / "out", "two")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert (tmp_path / "out" / "payload.txt").read_text() == "two"


def test_an_old_copy_that_cannot_be_deleted_does_not_fail_the_save(tmp_path, monkeypatch):
    _save(tmp_path / "out", "one")
    _undeletable(monkeypatch, "payload.txt")  # e.g. the old weights are still memory-mapped by a running process
    _save(tmp_path / "out", "two")
    monkeypatch.undo()
    verify(tmp_path / "out")
    assert (tmp_path / "out" / "payload.txt").read_text() == "two"
    recover(tmp_path / "out")  # the next load clears what was left of the old copy
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_leftover_that_cannot_be_deleted_does_not_stop_recovery(tmp_path, monkeypatch):
    _killed_between_the_renames(tmp_path, new_copy_finished=False)
    _undeletable(monkeypatch, "more.txt")
    recover(tmp_path / "out")
    _save(tmp_path / "out", "three")  # a save recovers first too, and must go through
    monkeypatch.undo()
    verify(tmp_path / "out")
    assert (tmp_path / "out" / "payload.txt").read_text() == "three"


def test_a_folder_with_a_long_name_can_be_saved_over(tmp_path):
    # the hidden siblings add 27 characters to the name; file systems allow 255
    target = tmp_path / ("checkpoint-" + "a" * 139)
    _save(target, "one")
    _save(target, "two")
    verify(target)
    assert (target / "payload.txt").read_text() == "two"
    assert os.listdir(tmp_path) == [target.name]


def _refuse_hard_links(source, destination):
    raise OSError("hard links are not supported here")


@pytest.mark.parametrize("hard_links", [True, False], ids=["hard-links", "no-hard-links"])
def test_the_users_symbolic_links_are_kept_as_links_across_saves(tmp_path, monkeypatch, hard_links):
    if not hard_links:  # a FAT or network drive: the user's files are copied, their links must still be links
        monkeypatch.setattr(atomic.os, "link", _refuse_hard_links)
    target = tmp_path / "out"
    (target / "data").mkdir(parents=True)
    (target / "data" / "corpus.txt").write_text("my corpus")
    os.symlink("data/corpus.txt", target / "latest")
    os.symlink("corpus.txt", target / "data" / "alias.txt")
    for text in ("one", "two"):
        _save(target, text)
    assert os.readlink(target / "latest") == "data/corpus.txt"
    assert os.readlink(target / "data" / "alias.txt") == "corpus.txt"
    assert (target / "latest").read_text() == "my corpus"
    (target / "data" / "corpus.txt").write_text("edited")  # still a link: it follows the file it points to
    assert (target / "data" / "alias.txt").read_text() == "edited"
    assert set(read_manifest(target)) == {"payload.txt", "sub/more.txt"}


def test_the_users_files_are_carried_by_hard_link_not_copied(tmp_path):
    # a large corpus kept beside a checkpoint must not be duplicated on disk by every save
    target = tmp_path / "out"
    (target / "data").mkdir(parents=True)
    (target / "notes.md").write_text("mine")
    (target / "data" / "corpus.txt").write_text("my corpus")
    inodes = {name: os.stat(target / name).st_ino for name in ("notes.md", "data/corpus.txt")}
    _save(target, "one")
    assert {name: os.stat(target / name).st_ino for name in inodes} == inodes
    assert (target / "data" / "corpus.txt").read_text() == "my corpus"
