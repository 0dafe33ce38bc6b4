"""The fetch env (hp_agent/envs/fetch.py): the env contract; a reader wins every game and a
policy that does not read wins exactly 1 in 9; held-out goals; rewards and shaping signs;
demonstrations; and ``hp-agent eval`` on it with the tiny model."""

from __future__ import annotations

import pickle
import random
import re
from collections import Counter
from collections.abc import Callable
from itertools import product

import pytest
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

from hp_agent.cli import app
from hp_agent.envs import list_envs, make
from hp_agent.envs.fetch import ITEMS, PLACES, SPOTS, FetchEnv, fetch_tasks, goal_items

# policy(observation, info, turn) -> action
Policy = Callable[[str, dict, int], str]


def play(env: FetchEnv, task_id: str, policy: Policy) -> list[tuple]:
    """Play one episode; the list of step results."""
    observation, info = env.reset(options={"task_id": task_id})
    steps = []
    while True:
        steps.append(env.step(policy(observation, info, len(steps))))
        if steps[-1][2] or steps[-1][3]:
            return steps
        observation, info = steps[-1][0], steps[-1][4]


def reader(observation: str, info: dict, turn: int) -> str:
    """Reads the prompt alone: goes to the name whose list holds the goal."""
    goal = re.search(r"Find the (\w+)\.", observation).group(1)
    return next(f"go to {name}" for name, items in re.findall(r"The (\w+) has: ([\w, ]+)\.", observation)
                if goal in items.split(", "))


def wins(env: FetchEnv, policy: Policy) -> int:
    return sum(play(env, task_id, policy)[-1][4]["verdict"].success for task_id in env.task_ids())


# ---- contract ------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "test"])
def test_registered_and_passes_gymnasium_checker(split: str) -> None:
    assert "fetch" in list_envs()
    env = make("fetch", split=split)
    check_env(env, skip_render_check=True)
    assert env.reward_bounds == (0.0, 1.0) and env.system_prompt and env.answer_format is None
    assert FetchEnv.eval_split == "test" and env.max_turns == 3


def test_reset_shows_the_goal_and_the_lists() -> None:
    env = FetchEnv(split="test")
    observation, info = env.reset(options={"task_id": "box:shop.drawer:2"})  # the module docstring's game
    assert observation == ("Find the box. The garden has: lettuce, towel, egg. The house has: knife, pan, mug. "
                           "The shop has: cup, box, apple.")
    assert info == {"task_id": "box:shop.drawer:2", "task_type": "box", "expert_action": "go to shop",
                    "admissible_actions": ["go to garden", "go to house", "go to shop"]}
    assert env.reset(seed=7) == env.reset(seed=7)  # a seed picks a task deterministically
    with pytest.raises(LookupError, match="unknown task id"):
        env.reset(options={"task_id": "nope"})


@pytest.mark.parametrize("kwargs", [{"split": "valid"}, {"layouts": 0}, {"invalid_cost": -0.1},
                                    {"demo_mistakes": 1.5}, {"demo_episodes": 0}])
def test_bad_options_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        FetchEnv(**kwargs)


# ---- reading is needed, and enough ----------------------------------------------------


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_reader_wins_every_game_with_reward_one(split: str) -> None:
    env = FetchEnv(split=split)
    for task_id in env.task_ids():
        steps = play(env, task_id, reader)
        assert [s[1] for s in steps] == [0.0, 1.0] and steps[-1][2] and not steps[-1][3]
        assert all(s[4]["shaping"] == 0.0 and not s[4]["invalid_action"] for s in steps)
        assert steps[-1][4]["verdict"].success and steps[-1][4]["verdict"].reward == 1.0


def test_the_expert_is_the_reader() -> None:
    env = FetchEnv(split="test")
    assert wins(env, lambda o, info, t: info["expert_action"]) == len(env.task_ids())
    for task_id in env.task_ids()[:20]:
        observation, info = env.reset(options={"task_id": task_id})
        assert info["expert_action"] == reader(observation, info, 0)


@pytest.mark.parametrize("split", ["train", "test"])
def test_policies_that_do_not_read_win_exactly_one_in_nine(split: str) -> None:
    env = FetchEnv(split=split)
    ninth = len(env.task_ids()) // 9
    assert ninth * 9 == len(env.task_ids())
    for place, spot in product(PLACES, SPOTS):  # the same two names every game
        assert wins(env, lambda o, i, turn: f"go to {(place, spot)[min(turn, 1)]}") == ninth
    for first, second in product(range(3), repeat=2):  # the same positions in the lists every game
        assert wins(env, lambda o, info, turn: info["admissible_actions"][(first, second)[min(turn, 1)]]) == ninth
    rng = random.Random(0)  # uniform over the admissible actions: 1/9 in expectation
    uniform = wins(env, lambda o, info, t: rng.choice(info["admissible_actions"])) / len(env.task_ids())
    assert abs(uniform - 1 / 9) < 0.08


@pytest.mark.parametrize("split", ["train", "test"])
def test_neither_the_goal_nor_the_order_tells_where_it_is(split: str) -> None:
    tasks = fetch_tasks(split)
    groups: dict[tuple, Counter] = {}
    for t in tasks:  # what a policy sees without reading the lists: the goal word and the order
        groups.setdefault((t.goal, t.places, t.spots), Counter())[(t.place, t.spot)] += 1
    for routes in groups.values():
        assert sorted(routes) == sorted(product(PLACES, SPOTS)) and len(set(routes.values())) == 1
    positions = Counter((t.places.index(t.place), t.spots.index(t.spot)) for t in tasks)
    assert len(positions) == 9 and len(set(positions.values())) == 1
    for task in tasks:
        assert sorted(task.places) == sorted(PLACES) and sorted(task.spots) == sorted(SPOTS)
        items = [item for row in task.grid for item in row]
        assert len(set(items)) == 9 and items.count(task.goal) == 1


# ---- held-out split --------------------------------------------------------------------


def test_test_goals_are_never_fetched_in_training() -> None:
    train, test = fetch_tasks("train"), fetch_tasks("test")
    assert (len(train), len(test)) == (432, 144)
    assert not {t.goal for t in train} & {t.goal for t in test}  # the split rule
    assert {t.goal for t in train} | {t.goal for t in test} == set(ITEMS) and len(goal_items("test")) == 4
    assert not {t.id for t in train} & {t.id for t in test}
    seen = {item for t in train for row in t.grid for item in row}
    assert set(goal_items("test")) <= seen  # the held-out words do appear in training, never as the goal

    def observations(split: str) -> set[str]:
        env = FetchEnv(split=split)
        return {o for o, _ in env.demonstrations()}

    assert not observations("train") & observations("test")  # no test prompt is seen in training


def test_tasks_are_deterministic_and_seeded() -> None:
    assert fetch_tasks("test") == fetch_tasks.__wrapped__("test")  # not just the cache
    assert FetchEnv(split="test").task_ids() == FetchEnv(split="test").task_ids()
    assert set(goal_items("test", seed=1)) != set(goal_items("test"))
    assert len(fetch_tasks("train", layouts=2)) == 216
    first = [t.goal for t in fetch_tasks("test")[:12]]
    assert len(set(first)) > 1  # a prefix (eval --limit) mixes goals


# ---- rules, rewards, shaping -----------------------------------------------------------


def test_invalid_actions_cost_and_use_up_the_turn() -> None:
    env = FetchEnv(split="test", invalid_cost=0.25)
    start, _ = env.reset(options={"task_id": "box:shop.drawer:2"})
    for action, parsed, event in [("go to drawer", "go to drawer", "You cannot do that."),  # a spot, not a place
                                  ("", "", "Unknown action."),
                                  ("go to the shop", "", "Unknown action.")]:
        env.reset(options={"task_id": "box:shop.drawer:2"})
        observation, reward, terminated, truncated, info = env.step(action)
        assert info["invalid_action"] and info["shaping"] == -0.25 and reward == -0.25  # negative: a cost
        assert info["action"] == parsed and not terminated and not truncated
        assert observation == f"{event} {start}"  # nothing changed but the turn count
    env.reset(options={"task_id": "box:shop.drawer:2"})
    steps = [env.step(action) for action in ("dance", "go to shop", "go to shop")]  # the last: a place, in the shop
    assert [s[1] for s in steps] == [-0.25, 0.0, -0.25]
    _, reward, terminated, truncated, info = steps[-1]
    assert truncated and not terminated and info["verdict"].reward == 0.0 and not info["verdict"].success
    assert info["verdict"].feedback == "lost: out of turns in the shop after 3 turns; invalid actions: 2."
    pickle.dumps(info)  # infos cross process boundaries in env pools
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("go to drawer")


@pytest.mark.parametrize(("actions", "last"), [(["go to garden"], "The garden has no box."),
                                               (["go to shop", "go to shelf"], "The shelf has no box.")])
def test_a_wrong_name_ends_the_game_lost(actions: list[str], last: str) -> None:
    env = FetchEnv(split="test")
    env.reset(options={"task_id": "box:shop.drawer:2"})
    steps = [env.step(action) for action in actions]
    observation, reward, terminated, truncated, info = steps[-1]
    assert (observation, reward, terminated, truncated) == (last, 0.0, True, False)
    assert info["shaping"] == 0.0 and not info["invalid_action"]  # valid, just wrong
    verdict = info["verdict"]
    assert verdict.reward == 0.0 and not verdict.success and verdict.feedback.startswith("lost: went to the")
    assert "drawer" not in verdict.feedback  # never where the box was
    assert len(actions) > 1 or "shop" not in verdict.feedback


def test_a_spare_turn_recovers_from_one_malformed_reply() -> None:
    env = FetchEnv(split="test")
    env.reset(options={"task_id": "box:shop.drawer:2"})
    steps = [env.step(action) for action in ("go to", "  GO  To Shop ", "go to drawer")]  # case and spaces are free
    assert [s[1] for s in steps] == [-0.1, 0.0, 1.0] and steps[-1][2]
    assert steps[1][0] == "Find the box. You are in the shop. The table has: cup. The drawer has: box. The shelf has: apple."
    assert steps[-1][0] == "You take the box from the drawer."
    assert steps[-1][4]["verdict"].feedback == "won: took the box after 3 turns; invalid actions: 1."


# ---- demonstrations ---------------------------------------------------------------------


def test_demonstrations_without_mistakes_are_the_reader_and_win() -> None:
    env = FetchEnv()
    pairs = list(env.demonstrations())
    assert len(pairs) == 2 * len(env.task_ids())  # two turns a game, nothing wasted
    assert all(action == reader(observation, {}, 0) for observation, action in pairs)
    assert {reader(o, {}, 0).split()[-1] for o, _ in pairs} == set(PLACES + SPOTS)
    assert {re.search(r"Find the (\w+)\.", o).group(1) for o, _ in pairs} == set(goal_items("train"))  # train only


@pytest.mark.parametrize("mistakes", [0.3, 0.5])
def test_demonstration_mistakes_have_the_asked_rate_and_are_valid_actions(mistakes: float) -> None:
    env = FetchEnv(demo_mistakes=mistakes, demo_episodes=3)
    pairs = list(env.demonstrations())
    for observation, action in pairs:  # a listed name each time: wrong, never malformed
        assert action in {f"go to {name}" for name in re.findall(r"The (\w+) has:", observation)}
    wrong = [action != reader(observation, {}, 0) for observation, action in pairs]
    assert abs(sum(wrong) / len(wrong) - mistakes) < 0.03
    assert list(FetchEnv(demo_mistakes=mistakes, demo_episodes=3).demonstrations())[:50] == pairs[:50]  # seeded


# ---- commands ----------------------------------------------------------------------------


@pytest.mark.slow
def test_listed_and_evaluated_by_the_cli_with_the_tiny_model(tmp_path, monkeypatch, _private_cache) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    listed = runner.invoke(app, ["envs"])
    assert listed.exit_code == 0 and "fetch" in listed.output.split()
    out = tmp_path / "eval.json"
    result = runner.invoke(app, ["eval", "--env", "fetch", "--model", "tiny", "--split", "test", "--limit", "4", "--max-new-tokens", "5",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert '"tasks": 4' in out.read_text() and '"split": "test"' in out.read_text()
