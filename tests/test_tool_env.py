"""hp_agent envs as TRL tool-calling environments (hp_agent/envs/tool_env.py).

The adapter itself needs no TRL: these tests hold it to TRL 1.16's contract (a class
built with no arguments, ``reset(**row) -> str``, ``get_reward() -> float``, every other
public function a tool). The last test runs one real ``GRPOTrainer`` step and runs only
where TRL is installed (``make test-trl``, in ``.venv-trl``).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from hp_agent.envs import make
from hp_agent.envs.tool_env import ENDED, ToolEnv, environment_factory, task_rows
from hp_agent.envs.toy import expert_action
from hp_agent.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def test_the_only_tool_trl_finds_is_act():
    # TRL lists the class's functions; reset and get_reward are its hooks, the rest are tools.
    public = {name for name, _ in inspect.getmembers(ToolEnv, predicate=inspect.isfunction) if not name.startswith("_")}
    assert public == {"reset", "get_reward", "act"}
    doc = inspect.getdoc(ToolEnv.act)
    assert "Args:" in doc and "action:" in doc  # transformers builds the tool's JSON schema from these


def test_expert_play_through_the_tool_matches_the_env_and_wins():
    factory = environment_factory("keys")
    rows = task_rows("keys")
    assert [row["task_id"] for row in rows] == make("keys").task_ids()
    for row in rows[:6]:
        tool, local = factory(), make("keys")
        text = tool.reset(**row)  # TRL passes the whole row, prompt included
        local_text, info = local.reset(options={"task_id": row["task_id"]})
        assert text.startswith(local_text) and "Admissible actions: " in text
        total, done = 0.0, False
        while not done:
            action = expert_action(local.position in local.opened, local.has_key)
            reply = tool.act(f" {action} ")
            local_text, reward, terminated, truncated, info = local.step(action)
            assert reply.startswith(local_text)
            total, done = total + reward, terminated or truncated
        assert terminated and tool.get_reward() == total == 1.0
        assert reply.endswith(ENDED) and tool.act("open") == ENDED and tool.get_reward() == 1.0


def test_the_reward_falls_with_invalid_and_losing_play():
    tool = environment_factory("keys", invalid_cost=0.25)()
    tool.reset(task_id=make("keys").task_ids()[2])
    assert tool.get_reward() == 0.0
    tool.act("use key")  # invalid: no key held
    assert tool.get_reward() == pytest.approx(-0.25)
    while not tool.act("open").endswith(ENDED):  # opening an open box is invalid too: out of turns, lost
        pass
    assert tool.get_reward() < -0.25


def test_a_new_reset_starts_a_fresh_return():
    tool = environment_factory("keys")()
    task_id = make("keys").task_ids()[0]
    tool.reset(task_id=task_id)
    tool.act("bogus")
    assert tool.get_reward() < 0
    tool.reset(task_id=task_id)
    assert tool.get_reward() == 0.0


def test_a_bad_env_or_argument_fails_when_the_factory_is_made():
    with pytest.raises(UserError, match="unknown env 'nope'"):
        environment_factory("nope")
    with pytest.raises(UserError, match="bogus"):
        environment_factory("keys", bogus=1)


@pytest.mark.slow
def test_alfworld_walkthrough_wins_through_the_tool_with_bare_actions():
    pytest.importorskip("alfworld", reason="alfworld is not installed (pip install -e '.[alfworld]')")
    from hp_agent.envs.alfworld import data

    root = data.find_data_root()
    if root is None:
        pytest.skip(data.missing_data_message())
    games = {"split": "id", "data_root": str(root), "num_games": 2}
    tool, local = environment_factory("alfworld", **games)(), make("alfworld", **games, walkthrough_info=True)
    for row in task_rows("alfworld", **games):
        tool.reset(**row)
        _, info = local.reset(options={"task_id": row["task_id"]})
        for command in info["walkthrough"]:
            reply = tool.act(command)  # bare, as a model writes a tool argument
        assert reply.endswith(ENDED) and tool.get_reward() > 0


def test_one_trl_grpo_step_on_keys():
    pytest.importorskip("trl", reason="TRL is not installed here: make test-trl runs this in .venv-trl")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_grpo_keys.py"), "--steps", "1"],
                            capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "trained 1 GRPOTrainer step(s) on keys" in result.stdout
