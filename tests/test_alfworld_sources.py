"""Choosing the games an ALFWorld env plays: official first, synthesized games built on
first use where the official ones are absent, and clear errors for the evaluation splits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("fast_downward")

from hp_agent.envs.alfworld import data, sources  # noqa: E402
from hp_agent.envs.alfworld.env import AlfworldEnv  # noqa: E402


@pytest.fixture
def no_official(monkeypatch, tmp_path):
    """A machine without official games: empty cache, no shared folder, no $ALFWORLD_DATA."""
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HP_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HP_AGENT_SHARED", str(tmp_path / "no-shared"))
    assert data.find_data_root() is None
    return tmp_path / "cache"


def test_train_falls_back_to_synthesized_games_built_once(no_official, capsys):
    env = AlfworldEnv(split="train", num_games=2, expert=False)
    assert env.data_root == sources.synth_root() == no_official / "alfworld_synth"
    assert len(env.task_ids()) == 2 and all(t.startswith("train/") for t in env.task_ids())
    assert "building 2 synthesized train games" in capsys.readouterr().err
    manifest = json.loads((env.data_root / sources.MANIFEST).read_text())
    assert manifest == {"train": 2}
    observation, info = env.reset(options={"task_id": env.task_ids()[0]})
    assert "Your task is to:" in observation and info["admissible_actions"]
    env.close()
    again = AlfworldEnv(split="train", num_games=2, expert=False)  # nothing to build the second time
    assert again.task_ids() == env.task_ids() and "building" not in capsys.readouterr().err


def test_eval_splits_do_not_substitute_silently(no_official):
    with pytest.raises(data.AlfworldDataError) as error:
        AlfworldEnv(split="ood")
    message = str(error.value)
    assert "alfworld-download" in message and "--split ood --source synth" in message
    assert "four valid_unseen floor plans" in message and not sources.synth_root().exists()
    with pytest.raises(data.AlfworldDataError, match="official"):
        AlfworldEnv(split="train", source="official")
    with pytest.raises(data.AlfworldDataError, match="--from-alfred"):
        AlfworldEnv(split="id", source="alfred")
    with pytest.raises(ValueError, match="unknown ALFWorld source 'web'; valid: auto, official, synth, alfred"):
        AlfworldEnv(split="id", source="web")


def test_official_games_win_when_present():
    if data.find_data_root() is None:
        pytest.skip("official ALFWorld games not found (ALFWORLD_DATA or the shared tarball)")
    assert sources.resolve_data_root("train") == data.find_data_root()
    assert "official" in sources.source_of(data.find_data_root())


def test_cli_builds_and_counts_synthesized_games(no_official):
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "hp_agent.cli", "data", "alfworld", "--build", "--split", "ood",
                          "--count", "2", "--workers", "1"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "synthesized from the alfworld wheel" in out.stdout and "[synth valid_unseen] 2/2 (" in out.stderr
    assert "2 written" in out.stderr  # the progress line (stderr is not a terminal here)
    row = next(line for line in out.stdout.splitlines() if line.strip("│ ").startswith("ood"))
    assert row.split("│")[-2].strip() == "2"  # the total column
    out = subprocess.run([sys.executable, "-m", "hp_agent.cli", "data", "alfworld", "--build", "--split", "test"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "unknown split 'test'; valid: train, id, ood" in out.stdout
