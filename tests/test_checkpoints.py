"""Checkpoints you can trust: a damaged one is found and skipped on resume, with a warning;
a write that fails (a full disk) leaves the run resumable and says how, in one line."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing

import hp_agent
from hp_agent.distributed import Ranks
from hp_agent.errors import UserError
from hp_agent.files import read_jsonl_records
from hp_agent.run_folder import checkpoint_damage, latest_checkpoint, model_source, resume_checkpoint
from hp_agent.runs import save_checkpoint

pytestmark = pytest.mark.slow


def _config(run_dir: Path, steps: int = 2) -> dict:
    """The fastest run that writes a checkpoint every step: keys, one prompt, 8 new tokens."""
    return {
        "env": {"name": "keys"},
        "rollout": {"max_new_tokens": 8},
        "trainer": {"steps": steps, "prompts_per_step": 1, "run_dir": str(run_dir.parent), "name": run_dir.name,
                    "checkpoint_every": 1, "views_per_step": 0},
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A two-step run with checkpoints step_000001 and step_000002; tests damage copies of it."""
    run = tmp_path_factory.mktemp("trained") / "run"
    hp_agent.train(_config(run), progress=False)
    return run


@pytest.fixture
def run(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def _truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": (lambda c: _truncate(c / "model" / "model.safetensors"), "model/model.safetensors has"),
    "flipped byte": (lambda c: _flip_a_byte(c / "optimizer.pt"), "optimizer.pt does not match its SHA-256"),
    "missing file": (lambda c: (c / "state.pt").unlink(), "state.pt is missing"),
    "missing manifest": (lambda c: (c / "manifest.json").unlink(), "no manifest.json"),
}


def test_a_checkpoint_lists_every_file_with_its_size_and_hash(run):
    checkpoint = latest_checkpoint(run)
    files = json.loads((checkpoint / "manifest.json").read_text())["files"]
    on_disk = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(files) == on_disk and {"model/model.safetensors", "optimizer.pt", "state.pt"} <= on_disk
    assert files["state.pt"]["bytes"] == (checkpoint / "state.pt").stat().st_size
    assert checkpoint_damage(checkpoint) is None


@pytest.mark.parametrize("kind", DAMAGE)
def test_resume_skips_a_damaged_checkpoint_for_the_previous_one_and_says_which(run, kind, caplog):
    damage, reason = DAMAGE[kind]
    damage(run / "checkpoints" / "step_000002")
    with caplog.at_level(logging.WARNING):
        assert resume_checkpoint(run) == run / "checkpoints" / "step_000001"
    (warning,) = caplog.messages
    assert "step_000002" in warning and reason in warning and "step_000001" in warning and "\n" not in warning


def test_resume_continues_from_the_previous_checkpoint_when_the_latest_is_truncated(run, caplog):
    """Today's fault: a truncated model.safetensors made --resume fail with a safetensors traceback."""
    _truncate(run / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        summary = hp_agent.train(resume=run, progress=False)
    assert summary.steps == 2
    assert [r["step"] for r in read_jsonl_records(run / "metrics.jsonl")] == [0, 1]  # step 1 redone, logged once
    assert any("step_000002" in m and "step_000001" in m for m in caplog.messages)
    assert latest_checkpoint(run).name == "step_000002" and checkpoint_damage(latest_checkpoint(run)) is None


def test_a_run_folder_as_a_model_skips_a_damaged_latest_as_resume_does(run, caplog):
    """eval, compare and sft name a run folder as a model: a truncated latest model crashed
    in safetensors, and with ``latest`` deleted the run was said to have no checkpoint."""
    _truncate(run / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        assert model_source(str(run)) == str(run / "checkpoints" / "step_000001" / "model")
    assert any("step_000002" in m and "step_000001" in m for m in caplog.messages)
    (run / "checkpoints" / "latest").unlink()
    assert model_source(str(run)) == str(run / "checkpoints" / "step_000001" / "model")
    hp_agent.evaluate(env="keys", model=str(run), limit=2)  # loads and plays the older model


def test_resume_with_no_valid_checkpoint_is_a_one_line_user_error(run):
    _truncate(run / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    (run / "checkpoints" / "step_000001" / "state.pt").unlink()
    with pytest.raises(UserError) as raised:
        hp_agent.train(resume=run, progress=False)
    message = str(raised.value)
    assert "\n" not in message and "step_000001" in message and "step_000002" in message


def test_a_full_disk_mid_checkpoint_ends_the_run_in_one_line_and_leaves_it_resumable(tmp_path, monkeypatch):
    """Today's fault: a full disk ended the run with torch's `unexpected pos` RuntimeError and left
    checkpoints/.tmp-step_000002 behind."""
    run = tmp_path / "run"
    save = torch.save

    def disk_full_at_step_2(obj, f, *args, **kwargs):
        target = str(f) if isinstance(f, (str, os.PathLike)) else f.name  # a path, or an open file
        if target.endswith(os.path.join(".tmp-step_000002", "state.pt")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), target)
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_step_2)
    with pytest.raises(UserError) as raised:
        hp_agent.train(_config(run), progress=False)
    message = str(raised.value)
    assert "\n" not in message
    for text in (str(run / "checkpoints" / ".tmp-step_000002"), "no space left on device", "step 1",
                 f"hp-agent train --resume {run}"):
        assert text in message, (text, message)
    assert not list((run / "checkpoints").glob(".tmp-*"))
    assert latest_checkpoint(run).name == "step_000001" and checkpoint_damage(latest_checkpoint(run)) is None

    monkeypatch.setattr(torch, "save", save)
    assert hp_agent.train(resume=run, progress=False).steps == 2
    assert latest_checkpoint(run).name == "step_000002"


def _write_model(folder: Path) -> None:
    """Stands in for a model and its tokenizer: writes one file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights").write_bytes(b"w")


def _two_checkpoints(rank: int, store: str, run: Path, failing_rank: int, error: Exception, outcomes: Path) -> None:
    """One of two gloo ranks: checkpoint 1, then checkpoint 2, whose shard write fails on ``failing_rank``."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)

    def shards(step: int):
        def write(folder: Path) -> None:
            if step == 2 and rank == failing_rank:
                raise error
            (folder / f"shard-{rank}").write_bytes(b"s")

        return write

    try:
        for step in (1, 2):
            save_checkpoint(run, step, _write_model, shards(step), {"step": step}, keep=2, ranks=Ranks(rank, 2))
        outcome = "saved"
    except Exception as raised:
        outcome = f"{type(raised).__name__}: {raised}"
    (outcomes / f"rank{rank}").write_text(outcome)
    dist.destroy_process_group()


@pytest.mark.parametrize(("failing_rank", "error", "expected"), [
    (1, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), ["CheckpointWriteError"] * 2),
    (0, OSError(errno.EACCES, os.strerror(errno.EACCES)), ["CheckpointWriteError"] * 2),
    (1, KeyError("bug"), ["RuntimeError: rank 1 failed", "KeyError"]),  # a bug stays a bug, where it happened
])
def test_a_write_failing_on_one_rank_stops_every_rank_and_leaves_the_last_checkpoint(tmp_path, failing_rank, error,
                                                                                     expected):
    """No rank waits forever for one that failed; the shards of the other ranks go too."""
    run, outcomes = tmp_path / "run", tmp_path / "outcomes"
    outcomes.mkdir()
    # forked, not spawned: the ranks start in a moment, without importing hp_agent again
    context = torch.multiprocessing.start_processes(_two_checkpoints, args=(str(tmp_path / "store"), run, failing_rank,
                                                                            error, outcomes),
                                                    nprocs=2, join=False, start_method="fork")
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("a rank hung after another failed to write its part of the checkpoint")
    said = [(outcomes / f"rank{rank}").read_text() for rank in (0, 1)]
    assert all(text.startswith(start) for text, start in zip(said, expected)), said
    if expected[0] == "CheckpointWriteError":
        assert all(os.strerror(error.errno).lower() in text and "step 1" in text for text in said), said
    assert not list((run / "checkpoints").glob(".tmp-*"))
    assert latest_checkpoint(run).name == "step_000001" and checkpoint_damage(latest_checkpoint(run)) is None
    listed = json.loads((latest_checkpoint(run) / "manifest.json").read_text())["files"]
    assert sorted(listed) == ["model/weights", "shard-0", "shard-1", "state.pt"]  # every rank's part, hashed by rank 0
