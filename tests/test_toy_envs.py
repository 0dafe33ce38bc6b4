"""The box-and-key envs (hp_agent/envs/toy.py): the env contract, rewards and shaping
signs, held-out splits, and the noisy demonstrations the learning tests warm up on."""

from __future__ import annotations

import pickle
import random

import pytest
from gymnasium.utils.env_checker import check_env

from hp_agent.envs import list_envs, make
from hp_agent.envs.toy import ACTIONS, COLOURS, NEXT, OPEN, USE_KEY, KeysEnv, KeyStepEnv, colour_sets, expert_action
from hp_agent.verifiers import Verdict


def play(env: KeysEnv, task_id: str, policy) -> list[tuple]:
    """Play one episode with ``policy(env) -> action``; the list of step results."""
    env.reset(options={"task_id": task_id})
    steps = []
    while True:
        steps.append(env.step(policy(env)))
        if steps[-1][2] or steps[-1][3]:
            return steps


def expert(env: KeysEnv) -> str:
    return expert_action(env.position in env.opened, env.has_key)


# ---- contract ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["keys", "keystep"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_registered_and_pass_gymnasium_checker(name: str, split: str) -> None:
    assert name in list_envs()
    env = make(name, split=split)
    check_env(env, skip_render_check=True)
    assert env.reward_bounds == (0.0, 1.0) and env.system_prompt and env.answer_format is None


@pytest.mark.parametrize("name", ["keys", "keystep"])
def test_reset_picks_the_task_and_reports_it(name: str) -> None:
    env = make(name)
    task_id = env.task_ids()[5]
    observation, info = env.reset(options={"task_id": task_id})
    assert info["task_id"] == task_id and info["task_type"]
    assert env.observation_space.contains(observation)
    assert env.reset(seed=7) == env.reset(seed=7)  # a seed picks a task deterministically
    with pytest.raises(LookupError, match="unknown task id"):
        env.reset(options={"task_id": "nope"})


@pytest.mark.parametrize("name", ["keys", "keystep"])
@pytest.mark.parametrize("num_boxes", [2, 3, 4])
def test_held_out_split_is_disjoint_from_train(name: str, num_boxes: int) -> None:
    train, test = make(name, num_boxes=num_boxes), make(name, split="test", num_boxes=num_boxes)
    assert train.task_ids() and test.task_ids()
    assert not set(train.task_ids()) & set(test.task_ids())
    train_sets, test_sets = (set(map(frozenset, colour_sets(s, num_boxes))) for s in ("train", "test"))
    assert not train_sets & test_sets  # no set of boxes is seen in both splits
    assert len(train_sets) + len(test_sets) == len(set(map(frozenset, colour_sets("train", num_boxes) + colour_sets("test", num_boxes))))
    assert 0.2 <= len(test_sets) / (len(train_sets) + len(test_sets)) <= 0.3
    for observation, _ in make(name, num_boxes=num_boxes).demonstrations():  # demonstrations come from train only
        shown = {c for c in COLOURS if f" {c} box" in observation}
        assert shown and all(any(c in s for s in train_sets) for c in shown)


@pytest.mark.parametrize("kwargs", [{"split": "valid"}, {"num_boxes": 1}, {"num_boxes": 8}, {"invalid_cost": -0.1},
                                    {"demo_mistakes": 1.5}, {"demo_episodes": 0}])
@pytest.mark.parametrize("cls", [KeysEnv, KeyStepEnv])
def test_bad_options_are_refused(cls, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        cls(**kwargs)


# ---- keys: rules, rewards, shaping ---------------------------------------------------


def test_keys_expert_wins_every_held_out_task_with_reward_one() -> None:
    env = KeysEnv(split="test")
    for task_id in env.task_ids():
        steps = play(env, task_id, expert)
        _, reward, terminated, truncated, info = steps[-1]
        assert terminated and not truncated and reward == 1.0
        assert info["verdict"] == Verdict(1.0, info["verdict"].feedback, True) and info["verdict"].feedback.startswith("won")
        assert all(s[1] == 0.0 and s[4]["shaping"] == 0.0 and not s[4]["invalid_action"] for s in steps[:-1])
        assert len(steps) <= env.max_turns == 6


def test_keys_invalid_action_costs_and_uses_up_the_turn() -> None:
    env = KeysEnv(invalid_cost=0.25)
    observation, info = env.reset(options={"task_id": "red-blue-yellow:2"})
    assert observation == "The red box (1 of 3) is closed." and info["admissible_actions"] == [OPEN, NEXT]
    for action, parsed in [(USE_KEY, USE_KEY), ("dance", ""), ("open the box", "")]:
        observation, reward, terminated, truncated, info = env.step(action)
        assert info["invalid_action"] and info["shaping"] == -0.25 and reward == -0.25  # negative: a cost
        assert info["action"] == parsed and not terminated and not truncated
        assert observation.endswith("The red box (1 of 3) is closed.")  # nothing changed but the turn count
    observation, reward, _, _, info = env.step("  OPEN ")  # case and surrounding space do not matter
    assert not info["invalid_action"] and reward == 0.0 and info["shaping"] == 0.0
    assert observation == "Nothing inside. The red box (1 of 3) is empty." and info["admissible_actions"] == [NEXT]
    _, reward, _, _, info = env.step(OPEN)  # reopening
    assert info["invalid_action"] and reward == -0.25
    _, reward, terminated, truncated, info = env.step(NEXT)  # turn 6 of 6: out of turns
    assert truncated and not terminated and reward == 0.0
    verdict = info["verdict"]
    assert verdict.reward == 0.0 and not verdict.success and "invalid actions: 4" in verdict.feedback
    assert "yellow" not in verdict.feedback and "3 of 3" not in verdict.feedback  # never where the key was
    pickle.dumps(info)  # infos cross process boundaries in env pools
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(OPEN)


def test_keys_walking_past_the_key_loses_the_game() -> None:
    env = KeysEnv()
    env.reset(options={"task_id": "red-blue-yellow:0"})
    assert env.step(NEXT)[1] == 0.0  # valid, but the key stays behind
    steps = [env.step(action) for action in (OPEN, NEXT, OPEN, USE_KEY, USE_KEY)]
    assert [s[4]["invalid_action"] for s in steps] == [False, False, False, True, True]
    assert steps[-1][3] and steps[-1][4]["verdict"].reward == 0.0
    assert "did not find the key" in steps[-1][4]["verdict"].feedback


def test_keys_finding_and_using_the_key() -> None:
    env = KeysEnv(num_boxes=2)
    env.reset(options={"task_id": env.task_ids()[1]})  # key in the second box
    assert env.max_turns == 4 and env.task_ids()[1].endswith(":1")
    observation, *_ = env.step(OPEN)
    observation, _, _, _, info = env.step(NEXT)
    assert observation.startswith("You walk on.") and "(2 of 2) is closed" in observation
    assert info["admissible_actions"] == [OPEN]  # no next at the last box
    observation, _, _, _, info = env.step(OPEN)
    assert observation.startswith("You found the key!") and observation.endswith("You hold the key.")
    assert info["admissible_actions"] == [USE_KEY]
    observation, reward, terminated, _, info = env.step("use key")
    assert terminated and reward == 1.0 and info["verdict"].success and "after 4 turns" in info["verdict"].feedback


# ---- keystep ----------------------------------------------------------------------------


def test_keystep_rewards_the_expert_action_only() -> None:
    env = KeyStepEnv(invalid_cost=0.1)
    tasks = {task.task_type: task for task in (env.task(i) for i in env.task_ids())}
    assert set(tasks) == set(ACTIONS)
    for answer, task in tasks.items():
        env.reset(options={"task_id": task.id})
        observation, reward, terminated, truncated, info = env.step(answer)
        assert (observation, reward, terminated, truncated) == ("", 1.0, True, False)
        assert info["verdict"].success and info["shaping"] == 0.0 and info["action"] == answer
    closed = env.task(next(i for i in env.task_ids() if i.endswith("@0:closed")))  # NEXT: allowed, not the best
    env.reset(options={"task_id": closed.id})
    _, reward, _, _, info = env.step(NEXT)
    assert reward == 0.0 and info["shaping"] == 0.0 and not info["invalid_action"] and not info["verdict"].success
    env.reset(options={"task_id": closed.id})
    _, reward, _, _, info = env.step(USE_KEY)  # no key held: not allowed
    assert info["invalid_action"] and info["shaping"] == -0.1 and reward == -0.1 and info["verdict"].reward == 0.0
    with pytest.raises(RuntimeError, match="one step per episode"):
        env.step(OPEN)


def test_keystep_questions_are_keys_states() -> None:
    keys, keystep = KeysEnv(), KeyStepEnv()
    observations = {o[o.index("The "):] for o, _ in keys.demonstrations()}  # the state, without the event
    questions = {keystep.task(i).question for i in keystep.task_ids()}
    assert observations <= questions  # every state the expert meets is a question


# ---- demonstrations ------------------------------------------------------------------


def test_demonstrations_without_mistakes_are_the_expert_and_win() -> None:
    env = KeysEnv()
    pairs = list(env.demonstrations())
    assert {action for _, action in pairs} == set(ACTIONS)
    wins = sum(action == USE_KEY for _, action in pairs)
    assert wins == len(env.task_ids())  # one winning "use key" per episode, nothing wasted
    step = KeyStepEnv()
    assert all(step.task(i).answer == a for i, (_, a) in zip(step.task_ids(), step.demonstrations()))


@pytest.mark.parametrize("mistakes", [0.3, 0.5])
def test_demonstration_mistakes_have_the_asked_rate(mistakes: float) -> None:
    step = KeyStepEnv(demo_mistakes=mistakes, demo_episodes=2)
    answers = [step.task(i).answer for i in step.task_ids()] * 2
    wrong = [a != b for a, (_, b) in zip(answers, step.demonstrations())]
    assert abs(sum(wrong) / len(wrong) - mistakes) < 0.03
    keys = KeysEnv(demo_mistakes=mistakes)
    actions = []
    for observation, action in keys.demonstrations():
        has_key, is_open = "You hold the key" in observation, observation.split(" is ")[-1].startswith("empty")
        actions.append(action != expert_action(is_open, has_key))
    assert abs(sum(actions) / len(actions) - mistakes) < 0.03
    assert list(KeysEnv(demo_mistakes=mistakes).demonstrations())[:50] == list(keys.demonstrations())[:50]  # seeded


def test_random_play_reaches_every_outcome() -> None:
    env, rng = KeysEnv(), random.Random(0)
    outcomes = {(s[-1][4]["verdict"].success, s[-1][2]) for s in (play(env, t, lambda e: rng.choice(ACTIONS)) for t in env.task_ids()[:200])}
    assert outcomes == {(True, True), (False, False)}
