"""Rollout: prompts per turn, with the env's own history or the whole conversation; turns
cut at max_new_tokens are flagged, and with truncated_invalid played as invalid actions."""

from contextlib import contextmanager

import pytest
import torch

from hp_agent import TextEnv, Verdict
from hp_agent.envs import make
from hp_agent.envs.alfworld.env import parse_action as alfworld_action
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


@contextmanager
def ending_turns_early(policy, bias: float):
    """The policy's end-of-turn logit raised by ``bias``: the random tiny model, which
    otherwise never samples it (1 of ~4,000 ids), ends most turns within a few tokens."""

    def raise_end_of_turn(module, inputs, logits):
        return logits.index_add(-1, torch.tensor([policy.eos_token_id]), logits.new_full((*logits.shape[:-1], 1), bias))

    handle = policy.model.get_output_embeddings().register_forward_hook(raise_end_of_turn)
    try:
        yield
    finally:
        handle.remove()


def _keys(policy, max_new_tokens):
    envs = [make("keys"), make("keys")]
    episodes = [Episode(task_id) for task_id in envs[0].task_ids()[:2]]
    return collect(policy, envs, "keys", episodes, SamplingParams(max_new_tokens=max_new_tokens), seed=0)


def test_a_turn_cut_at_max_new_tokens_is_flagged_truncated(tiny_policy):
    torch.manual_seed(0)
    turns = [turn for t in _keys(tiny_policy, max_new_tokens=2) for turn in t.turns]
    assert len(turns) == 12 and all(len(turn.action_ids) == 2 and turn.action_ids[-1] != tiny_policy.eos_token_id for turn in turns)
    assert all(turn.truncated for turn in turns)
    with ending_turns_early(tiny_policy, bias=8.0):
        turns = [turn for t in _keys(tiny_policy, max_new_tokens=64) for turn in t.turns]
    assert turns and all(turn.action_ids[-1] == tiny_policy.eos_token_id for turn in turns)  # every turn ended itself
    assert not any(turn.truncated for turn in turns)


class Picky(Rooms):
    """Three turns; only an empty action is invalid, at a cost of 0.25. The observation
    does not depend on the action, so two runs of one seed sample the same turns."""

    def reset(self, seed=None, options=None):
        self.received = []
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.received.append(action)
        observation, reward, terminated, truncated, info = super().step(action)
        shaping = -0.25 if action == "" else 0.0
        return observation, reward + shaping, terminated, truncated, {**info, "invalid_action": action == "", "shaping": shaping}


def test_truncated_invalid_charges_the_envs_invalid_cost_on_truncated_turns_only(tiny_policy):
    runs = {}
    for truncated_invalid in (False, True):
        torch.manual_seed(0)
        tiny_policy.prefix_cache.clear()  # both runs start cold: reused keys differ in the last float bits
        envs = [Picky() for _ in range(4)]
        with ending_turns_early(tiny_policy, bias=8.0):  # some turns end within 2 tokens, some are cut
            trajectories = collect(tiny_policy, envs, "rooms", [Episode("walk")] * 4, SamplingParams(max_new_tokens=2),
                                   truncated_invalid=truncated_invalid)
        runs[truncated_invalid] = ([turn for t in trajectories for turn in t.turns], [a for env in envs for a in env.received])
    (kept, kept_sent), (invalid, invalid_sent) = runs[False], runs[True]
    assert [t.action_ids for t in kept] == [t.action_ids for t in invalid]  # the same samples
    assert {t.truncated for t in kept} == {True, False} and any(t.truncated and t.shaping == 0.0 for t in kept)
    assert kept_sent == [t.action_text for t in kept]  # the default sends every turn's text, cut or not
    assert invalid_sent == ["" if t.truncated else t.action_text for t in kept]
    assert [t.shaping for t in invalid] == [-0.25 if t.truncated else t.shaping for t in kept]  # a cost: negative
    assert [t.invalid for t in invalid] == [t.truncated or t.invalid for t in kept]


def test_truncated_invalid_marks_a_truncated_turn_invalid_whatever_the_env_says(tiny_policy):
    torch.manual_seed(0)
    (trajectory,) = collect(tiny_policy, [Rooms()], "rooms", [Episode("walk")], SamplingParams(max_new_tokens=2),
                            truncated_invalid=True)
    assert all(turn.truncated and turn.invalid for turn in trajectory.turns)
    assert all(turn.shaping == 0.0 for turn in trajectory.turns)  # Rooms reports no invalid-action cost: none is added


@pytest.mark.parametrize(("name", "cost"), [("keys", 0.1), ("keystep", 0.1), ("math", 0.0), ("code", 0.0)])
def test_builtin_envs_answer_an_empty_action_as_invalid(name, cost):
    """What truncated_invalid relies on: the env charges its own invalid-action cost."""
    env = make(name)
    env.reset(seed=0)
    info = env.step("")[4]
    assert info["invalid_action"] and info["shaping"] == -cost
    assert alfworld_action("") == ("", False)  # ALFWorld then charges its invalid_penalty (0.1)


def test_scripted_play_is_prompted_as_a_model_is(tiny_policy):
    """A scripted player goes through the model's loop: the same first prompt (the env's
    system prompt first), and with chat_history the whole conversation after it."""
    from hp_agent.rollout import play
    from hp_agent.scripted_play import ScriptedActor

    env = make("keys", split="train")
    task = env.task_ids()[0]
    (model,) = collect(tiny_policy, [env], "keys", [Episode(task)], SamplingParams(max_new_tokens=4), chat_history=True)
    (scripted,) = play(ScriptedActor("random"), [env], "keys", [Episode(task)], chat_history=True)
    first = scripted.turns[0]
    assert first.prompt_messages == model.turns[0].prompt_messages
    assert first.prompt_messages[0] == {"role": "system", "content": env.system_prompt}
    assert scripted.turns[1].prompt_messages == first.prompt_messages + [
        {"role": "assistant", "content": first.action_text},
        {"role": "user", "content": first.observation},
    ]
    assert not first.prompt_ids and not first.action_ids  # text only: a scripted player knows no tokenizer
