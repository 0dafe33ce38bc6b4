"""hp_agent.files: a write that fails leaves the old file and no temporary one behind;
folders appear whole or not at all."""

from __future__ import annotations

import json

import pytest

from hp_agent.files import (
    FolderExistsError,
    atomic_file,
    atomic_folder,
    atomic_write_bytes,
    atomic_write_text,
    read_jsonl_records,
)


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "deep" / "a.txt"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert path.read_text() == "two" and (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "b.bin", "deep"]
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError, match="midway"), atomic_file(path) as f:
        f.write("half of the new")
        raise RuntimeError("midway")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_two_open_writers_of_one_path_use_different_temporaries(tmp_path):
    path = tmp_path / "a.txt"
    with atomic_file(path) as first, atomic_file(path) as second:
        assert first.name != second.name
        first.write("first")
        second.write("second")
    assert path.read_text() == "first"  # the outer block ends last


def test_a_folder_appears_whole_refuses_a_full_target_and_replaces_when_asked(tmp_path):
    out = tmp_path / "model"
    with atomic_folder(out) as tmp:
        (tmp / "config.json").write_text("{}")
        assert not out.exists()
    assert (out / "config.json").is_file()
    with pytest.raises(FolderExistsError), atomic_folder(out) as tmp:
        (tmp / "other").write_text("x")
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    with atomic_folder(out, replace=True) as tmp:
        (tmp / "other").write_text("x")
    assert sorted(p.name for p in out.iterdir()) == ["other"]
    with pytest.raises(KeyError), atomic_folder(tmp_path / "never") as tmp:
        raise KeyError("a failed build")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_jsonl_records_and_a_missing_file(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n\n" + json.dumps({"step": 2}) + "\n")
    assert read_jsonl_records(path) == [{"step": 1}, {"step": 2}]
    assert read_jsonl_records(tmp_path / "none.jsonl", missing_ok=True) == []
    with pytest.raises(FileNotFoundError):
        read_jsonl_records(tmp_path / "none.jsonl")
