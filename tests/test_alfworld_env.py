"""ALFWorld on the real engine, on the official games (valid_seen = ID, valid_unseen = OOD).

Skipped when alfworld/textworld are not installed or the official game files are not
available (``$ALFWORLD_DATA`` or the shared tarball). Games load in ~1.5 s each, so the
tests share a few envs and play few games.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="alfworld is not installed (pip install -e '.[alfworld]')")
pytest.importorskip("textworld", reason="textworld[pddl] is not installed (pip install -e '.[alfworld]')")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from hp_agent.envs import make, register  # noqa: E402
from hp_agent.envs.alfworld import data  # noqa: E402
from hp_agent.envs.alfworld.env import (  # noqa: E402
    TEMPLATE_NO_HISTORY,
    AlfworldEnv,
    format_actions,
    parse_action,
)

# Importing alfworld sets ALFWORLD_DATA (to ~/.cache/alfworld) when unset: check its content.
_HAS_DATA = (Path(os.environ.get("ALFWORLD_DATA", "")) / data.JSON_FOLDER).is_dir() or data.shared_tarball().is_file()
pytestmark = pytest.mark.skipif(not _HAS_DATA, reason="official ALFWorld games not found: set ALFWORLD_DATA "
                                "or provide <shared>/data/alfworld_json_2.1.1_official.tar.gz")

TRANSCRIPTS = data.shared_dir() / "data" / "alfworld_transcripts" / "transcripts.jsonl"
# A pick-two game the fixed expert wins in 13 steps and ALFWorld 0.4.2's expert never wins.
PICK_TWO_GAME = "valid_unseen/pick_two_obj_and_place-KeyChain-None-Safe-219/trial_T20190909_011803_423115"


@pytest.fixture(scope="module")
def root() -> Path:
    # Resolved after conftest pointed HP_AGENT_CACHE at a private folder: the tarball is
    # unpacked there, never into the user's cache.
    found = data.find_data_root()
    assert found is not None, data.missing_data_message()
    return found


@pytest.fixture(scope="module")
def id_env(root) -> AlfworldEnv:
    env = AlfworldEnv(split="id", data_root=root, num_games=12)
    yield env
    env.close()


@pytest.fixture(scope="module")
def ood_env(root) -> AlfworldEnv:
    env = AlfworldEnv(split="ood", data_root=root)
    yield env
    env.close()


def act(command: str) -> str:
    return f"<think>scripted</think><action>{command}</action>"


# ---- data ----------------------------------------------------------------------------------
def test_official_splits_have_alfworld_game_counts(root):
    counts = {split: len(data.list_games(root, split)) for split in ("id", "ood", "train")}
    assert counts == {"id": 140, "ood": 134, "train": 200}  # train: the valid_train sample
    assert len(data.list_games(root, "valid_seen")) == 140  # official names work too
    games = data.list_games(root, "ood")
    assert [g.game_file for g in games] == sorted(g.game_file for g in games)
    assert {g.task_type for g in games} == set(data.SHORT_TASK_TYPES)
    first = games[0]
    assert first.task_id == "/".join(first.game_file.parts[-4:-1]) and first.split == "valid_unseen"
    with pytest.raises(ValueError, match="unknown ALFWorld split 'test'; valid splits: train"):
        data.list_games(root, "test")


def test_missing_data_says_where_it_looked_and_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HP_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HP_AGENT_SHARED", str(tmp_path / "no-shared"))
    assert data.find_data_root() is None
    with pytest.raises(data.AlfworldDataError, match="alfworld-download") as error:
        AlfworldEnv(split="id")
    assert "ALFWORLD_DATA" in str(error.value) and str(tmp_path / "no-shared") in str(error.value)
    with pytest.raises(data.AlfworldDataError, match="holds no json_2.1.1"):
        AlfworldEnv(data_root=tmp_path)


def test_shared_tarball_is_unpacked_once(monkeypatch, tmp_path):
    if not data.shared_tarball().is_file():
        pytest.skip("no shared tarball")
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HP_AGENT_CACHE", str(tmp_path))
    first = data.find_data_root()
    assert first == tmp_path / "alfworld_data" and (first / "json_2.1.1" / "valid_seen").is_dir()
    stamp = first.stat().st_mtime_ns
    assert data.find_data_root() == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["alfworld_data"]  # no staging folder left


# ---- protocol ------------------------------------------------------------------------------
def test_parse_action_follows_verl_agent():
    assert parse_action("<think>x</think> <action> Go To Desk 1 </action><action>look</action>") == ("go to desk 1", True)
    assert parse_action("no tags, just words about the desk 1") == ("no tags, just words about the desk 1"[-30:], False)
    assert parse_action("<action>look</action>", require_think=True) == ("look", False)


def test_prompts_follow_verl_agent_format(id_env):
    observation, info = id_env.reset(seed=0, options={"task_id": id_env.task_ids()[0]})
    intro = info["game_text"]
    assert intro.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
    assert "help" not in info["admissible_actions"] and "look" in info["admissible_actions"]
    assert observation == TEMPLATE_NO_HISTORY.format(current_observation=intro,
                                                     admissible_actions=format_actions(info["admissible_actions"]))
    assert "Your admissible actions of the current situation are: ['" in observation
    assert "'\n '" in observation  # verl-agent's separator
    assert observation.endswith("present it within <action> </action> tags.\n")
    task = intro.split("Your task is to: ")[1]
    texts = [intro]
    for command in ("look", "inventory", "look"):
        observation, reward, terminated, truncated, info = id_env.step(act(command))
        texts.append(info["game_text"])
    assert observation.startswith("\nYou are an expert agent operating in the ALFRED Embodied Environment. "
                                  f"Your task is to: {task}\nPrior to this step, you have already taken 3 step(s). "
                                  "Below are the most recent 2 observaitons and the corresponding actions you took: "
                                  f"[Observation 2: '{texts[1]}', Action 2: 'inventory']\n"
                                  f"[Observation 3: '{texts[2]}', Action 3: 'look']\n"
                                  f"You are now at step 4 and your current observation is: {texts[3]}\n")
    assert "[Observation 1:" not in observation and "help'" not in observation


def test_chat_mode_sends_only_the_new_text(root):
    env = AlfworldEnv(split="id", data_root=root, num_games=1, prompt_mode="chat")
    first, _ = env.reset(seed=0)
    assert first.startswith("\nYou are an expert agent")  # instructions come with the first turn
    observation, *_, info = env.step(act("inventory"))
    assert observation == (f"{info['game_text']}\nYour admissible actions of the current situation are: "
                           f"[{format_actions(info['admissible_actions'])}].")
    env.close()


def test_engine_text_equals_published_transcripts(id_env, ood_env):
    if not TRANSCRIPTS.is_file():
        pytest.skip(f"no transcripts at {TRANSCRIPTS}")
    records = [json.loads(line) for line in TRANSCRIPTS.open()]
    by_id = {f"{r['split']}/{r['task_folder']}/{r['trial']}": r for r in records}
    # A complete new-text (alfworld 0.4) pick-two game: every reply must match, and it wins.
    record = by_id["valid_seen/pick_two_obj_and_place-Book-None-Desk-302/trial_T20190906_181233_363875"]
    env = AlfworldEnv(split="id", data_root=id_env.data_root, task_types=["pick2"])
    _, info = env.reset(seed=0, options={"task_id": "valid_seen/pick_two_obj_and_place-Book-None-Desk-302/"
                                                    "trial_T20190906_181233_363875"})
    assert info["game_text"] == record["initial_observation"]
    for step in record["steps"]:
        *_, info = env.step(act(step["action"]))
        assert info["game_text"] == step["observation"], step["action"]
    assert info["won"]
    env.close()
    # Initial observations of OOD games (published for all 134).
    for task_id in ood_env.task_ids()[:3]:
        _, info = ood_env.reset(seed=0, options={"task_id": task_id})
        assert info["game_text"] == by_id[task_id]["initial_observation"]


def test_invalid_actions_are_penalized_and_the_game_answers(id_env):
    _, info = id_env.reset(seed=0, options={"task_id": id_env.task_ids()[0]})
    observation, reward, terminated, truncated, info = id_env.step("I think I should look around carefully")
    assert info["invalid_action"] and info["shaping"] == pytest.approx(-0.1) and reward == pytest.approx(-0.1)
    assert info["action"] == "i think i should look around carefully"[-30:]
    assert info["game_text"] == "Nothing happens." and not terminated and not truncated
    # A bare admissible command still reaches the game (verl-agent) but is penalized.
    target = next(a for a in info["admissible_actions"] if a.startswith("go to "))
    _, reward, *_, info = id_env.step(target)
    assert info["invalid_action"] and reward == pytest.approx(-0.1) and info["game_text"].startswith("You arrive at")
    _, reward, *_, info = id_env.step(act("look"))
    assert not info["invalid_action"] and reward == 0.0 and info["shaping"] == 0.0


def test_win_terminates_and_step_limit_truncates(root, id_env):
    _, info = id_env.reset(seed=0, options={"task_id": id_env.task_ids()[0]})
    walkthrough = id_env.walkthrough()
    for k, command in enumerate(walkthrough):
        _, reward, terminated, truncated, info = id_env.step(act(command))
        assert terminated == (k == len(walkthrough) - 1) and not truncated
    assert reward == 10.0 and info["won"]
    verdict = info["verdict"]
    assert (verdict.reward, verdict.success) == (10.0, True)
    assert verdict.feedback == f"success: the task was completed in {len(walkthrough)} steps"
    with pytest.raises(RuntimeError, match="episode is over"):
        id_env.step(act("look"))

    env = AlfworldEnv(split="id", data_root=root, num_games=1, max_steps=3, win_reward=5.0)
    assert env.max_turns == 3 and env.reward_bounds == (0.0, 5.0)
    env.reset(seed=1)
    for k in range(3):
        _, reward, terminated, truncated, info = env.step(act("inventory"))
        assert truncated == (k == 2) and not terminated and reward == 0.0
    verdict = info["verdict"]
    assert (verdict.reward, verdict.success) == (0.0, False)
    assert verdict.feedback == ("failure: the task was not completed within 3 steps; last observation: "
                                "You are not carrying anything.")
    env.close()


@pytest.mark.filterwarnings("ignore:.*alternative render modes")
def test_gymnasium_check_env(root):
    env = AlfworldEnv(split="ood", data_root=root, num_games=2, max_steps=5)
    check_env(env)
    env.close()


# ---- expert --------------------------------------------------------------------------------
def test_legacy_placement_command():
    from hp_agent.envs.alfworld.engine import legacy_placement_command

    assert legacy_placement_command("move keychain 2 to safe 1") == "put keychain 2 in/on safe 1"
    assert legacy_placement_command("take keychain 2 from sofa 1") == "take keychain 2 from sofa 1"


@pytest.mark.slow
def test_expert_needs_the_move_fix_on_pick_two(root):
    """alfworld 0.4.2's expert never registers ``move``; the fixed one wins in 50 steps."""
    from alfworld.agents.expert import HandCodedTWAgent

    from hp_agent.envs.alfworld.engine import AlfworldGame, FixedHandCodedTWAgent

    game_file = root / "json_2.1.1" / PICK_TWO_GAME / "game.tw-pddl"
    outcomes = {}
    for expert_class in (HandCodedTWAgent, FixedHandCodedTWAgent):
        game = AlfworldGame(game_file, expert_class=expert_class)
        state, steps = game.reset(seed=0), 0
        while not state.won and steps < 50:
            state, steps = game.step(state.expert_action or "look"), steps + 1
        outcomes[expert_class.__name__] = (state.won, steps)
        game.close()
    assert outcomes["HandCodedTWAgent"] == (False, 50)
    assert outcomes["FixedHandCodedTWAgent"][0] and outcomes["FixedHandCodedTWAgent"][1] < 50


def test_an_error_in_the_expert_ends_its_advice_not_the_game(root):
    """ALFWorld's expert can raise (random.choice over no visible object): the episode goes on."""
    from hp_agent.envs.alfworld.engine import AlfworldGame, FixedHandCodedTWAgent

    class BrokenExpert(FixedHandCodedTWAgent):
        def act(self, *args, **kwargs):
            raise IndexError("Cannot choose from an empty sequence")

    game = AlfworldGame(root / "json_2.1.1" / PICK_TWO_GAME / "game.tw-pddl", expert_class=BrokenExpert)
    state = game.reset(seed=0)
    state = game.step("look")
    assert state.expert_action is None and not state.won
    assert game.expert_gave_up == "crashed: IndexError: Cannot choose from an empty sequence"
    assert "go to" in " ".join(game.step("look").admissible_commands)  # the game still answers
    game.close()


# ---- scripted policies ---------------------------------------------------------------------
# make test replays a type-balanced prefix of each split (6 games, one of each type) (task_ids() cycles through the
# task types); every game (~9 CPU-minutes) is replayed by `make test-exhaustive` in CI.
@pytest.mark.slow
@pytest.mark.parametrize("split,games", [
    ("id", 6), ("ood", 6),
    pytest.param("id", 140, marks=pytest.mark.exhaustive), pytest.param("ood", 134, marks=pytest.mark.exhaustive),
])
def test_walkthrough_replay_wins_the_official_games(root, split, games):
    from hp_agent.rollout import Episode, play
    from hp_agent.scripted_play import ScriptedActor, scripted_pool

    actor = ScriptedActor("walkthrough")
    with scripted_pool(actor, "alfworld", {"split": split, "data_root": root, "expert": False, "num_games": games},
                       workers=2) as pool:
        trajectories = play(actor, pool, "alfworld", [Episode(t, g) for g, t in enumerate(pool.task_ids())])
    assert len(trajectories) == games
    assert [t.task_id for t in trajectories if not t.success] == []
    assert all(not turn.invalid for t in trajectories for turn in t.turns)


def test_random_policy_is_seeded_and_expert_policy_plays(root, id_env):
    from hp_agent.rollout import Episode, play
    from hp_agent.scripted_play import ScriptedActor

    task_id = id_env.task_ids()[0]  # a pick game
    short = AlfworldEnv(split="id", data_root=root, num_games=1, max_steps=8)
    runs = [play(ScriptedActor("random"), [short], "alfworld", [Episode(task_id)], seed=seed)[0] for seed in (3, 3, 4)]
    short.close()
    actions = [[turn.action for turn in run.turns] for run in runs]
    assert actions[0] == actions[1] != actions[2]
    (expert,) = play(ScriptedActor("expert"), [id_env], "alfworld", [Episode(task_id)])
    assert expert.success and expert.turns[0].action == "look"  # AlfredExpert starts with look
    assert [turn.action for turn in expert.turns] == [turn.expert_action for turn in expert.turns]
    with pytest.raises(ValueError, match="valid: walkthrough, expert, random"):
        ScriptedActor("oracle")


def test_the_walkthrough_policy_names_what_it_needs(root):
    from hp_agent.rollout import Episode, play
    from hp_agent.scripted_play import ScriptedActor

    env = AlfworldEnv(split="id", data_root=root, num_games=1)
    with pytest.raises(KeyError, match="walkthrough_info=True"):
        play(ScriptedActor("walkthrough"), [env], "alfworld", [Episode(env.task_ids()[0])])
    env.close()


def test_scripted_evaluation_reports_per_task_type(root, tmp_path):
    from hp_agent.evaluation import evaluate

    register("alfworld", "hp_agent.envs.alfworld.env:AlfworldEnv", overwrite=True)
    assert isinstance(make("alfworld", split="ood", data_root=root, num_games=1), AlfworldEnv)
    result = evaluate(env="alfworld", split="ood", scripted="walkthrough", limit=2, output=tmp_path / "r.json",
                      env_kwargs={"data_root": str(root)})
    assert (result.tasks, result.avg_at_k, result.invalid_fraction, result.policy) == (2, 1.0, 0.0, "scripted:walkthrough")
    assert list(result.per_task_type) == ["pick", "look"] and result.per_task_type_tasks == {"pick": 1, "look": 1}
    assert json.loads((tmp_path / "r.json").read_text())["per_task_type"] == {"pick": 1.0, "look": 1.0}


# ---- texts ---------------------------------------------------------------------------------
def test_corpus_texts_are_the_same_with_or_without_data(monkeypatch, tmp_path, root):
    """The tiny model's tokenizer is trained on these: they must not depend on the machine."""
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    with_data = list(AlfworldEnv.corpus_texts())
    monkeypatch.delenv("ALFWORLD_DATA")
    monkeypatch.setenv("HP_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HP_AGENT_SHARED", str(tmp_path / "none"))
    assert list(AlfworldEnv.corpus_texts()) == with_data
    assert TEMPLATE_NO_HISTORY in with_data and any("Welcome to TextWorld" in text for text in with_data)

def test_subgoal_shaping_pays_a_walkthrough_and_leaves_success_alone(root):
    """Off by default (the protocol); on, a won heat game pays hold and apply once each as
    shaping, while the outcome reward and the verdict stay win_reward."""
    env = AlfworldEnv(split="id", data_root=root, task_types=["heat"], num_games=1, subgoal_reward=0.5)
    env.reset(seed=0)
    paid, shaping, rewards = [], 0.0, 0.0
    for command in env.walkthrough():
        _, reward, terminated, _, info = env.step(act(command))
        paid += info.get("subgoals", [])
        shaping, rewards = shaping + info["shaping"], rewards + reward
    assert terminated and paid == ["hold", "apply"] and shaping == 1.0 and rewards == 11.0
    assert info["verdict"].reward == 10.0 and info["verdict"].success
    env.close()
    with pytest.raises(ValueError, match=r"subgoal_reward must be in \[0, win_reward = 10.0\), got -1"):
        AlfworldEnv(split="id", data_root=root, num_games=1, subgoal_reward=-1)
