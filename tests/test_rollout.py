"""Rollout: prompts per turn, with the env's own history or the whole conversation."""

import pytest

from hp_agent import TextEnv, Verdict
from hp_agent.policies import SamplingParams
from hp_agent.rollout import Episode, collect


class Rooms(TextEnv):
    """Three turns in a row; the observation names the room."""

    max_turns = 3

    def task_ids(self):
        return ["walk"]

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return "room 0", {"task_id": "walk", "task_type": "rooms"}

    def step(self, action):
        self.turn += 1
        done = self.turn == 3
        info = {"verdict": Verdict(0.0, "failure", False)} if done else {}
        return f"room {self.turn}", 0.0, done, False, info


@pytest.mark.parametrize("chat_history", [False, True])
def test_turn_prompts(tiny_policy, chat_history):
    (trajectory,) = collect(tiny_policy, [Rooms()], "rooms", [Episode("walk")], SamplingParams(max_new_tokens=4), chat_history=chat_history)
    assert len(trajectory.turns) == 3 and trajectory.feedback == "failure"
    for turn in trajectory.turns:
        assert turn.prompt_ids == tiny_policy.render(turn.prompt_messages)  # rendered once, stored as ids
    last = trajectory.turns[2].prompt_messages
    if chat_history:
        first, second = trajectory.turns[0], trajectory.turns[1]
        assert last == [
            {"role": "user", "content": "room 0"},
            {"role": "assistant", "content": first.action_text},
            {"role": "user", "content": "room 1"},
            {"role": "assistant", "content": second.action_text},
            {"role": "user", "content": "room 2"},
        ]
    else:
        assert last == [{"role": "user", "content": "room 2"}]


def test_an_episode_cut_off_by_max_turns_gets_a_failure_verdict(tiny_policy):
    (trajectory,) = collect(tiny_policy, [Rooms()], "rooms", [Episode("walk")], SamplingParams(max_new_tokens=4), max_turns=2)
    assert len(trajectory.turns) == 2 and trajectory.truncated and trajectory.multi_turn
    assert (trajectory.reward, trajectory.success) == (0.0, False)
    assert trajectory.feedback == "The episode was cut off after 2 turns without finishing the task."


class TimeLimited(Rooms):
    """Truncates (its own time limit) after one turn, without a verdict."""

    reward_bounds = (-1.0, 1.0)

    def step(self, action):
        return "room 1", 0.0, False, True, {"shaping": -0.1, "invalid_action": True}


def test_an_env_truncation_without_a_verdict_gets_one_and_shaping_is_kept(tiny_policy):
    (trajectory,) = collect(tiny_policy, [TimeLimited()], "rooms", [Episode("walk")], SamplingParams(max_new_tokens=4))
    assert trajectory.truncated and trajectory.reward == -1.0 and not trajectory.success  # the env's lowest outcome
    assert "cut off after 1 turns" in trajectory.feedback
    assert trajectory.turns[0].shaping == -0.1 and trajectory.turns[0].invalid
