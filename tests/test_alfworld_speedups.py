"""Speed-ups for the ALFWorld engine: an episode with them equals one on a fresh load.

The reference is TextWorld's engine as shipped (``speedups=False``: every load and reset
translates and parses, every derivation deep-copies). The cached engine plays one game of each of the six task types
on a single engine, after another game and after an episode that changed the state, and
again from a fresh process cache that reads the translations from disk.
"""

from __future__ import annotations

import json
import random
import sys

import pytest

pytest.importorskip("alfworld", reason="alfworld is not installed (pip install -e '.[alfworld]')")
pytest.importorskip("textworld", reason="textworld[pddl] is not installed (pip install -e '.[alfworld]')")

from hp_agent.envs.alfworld import data  # noqa: E402

_HAS_DATA = data.find_data_root() is not None or data.shared_tarball().is_file()
pytestmark = pytest.mark.skipif(not _HAS_DATA, reason="official ALFWorld games not found")

SEED = 7
MAX_STEPS = 30


@pytest.fixture(scope="module")
def games() -> dict[str, object]:
    """One valid_seen game per task type, in the env's (type-cycling) order."""
    from hp_agent.envs.alfworld.env import AlfworldEnv

    env = AlfworldEnv(split="id", num_games=6)
    chosen = {env.game(t).task_type: env.game(t).game_file for t in env.task_ids()}
    env.close()
    assert sorted(chosen) == ["clean", "cool", "heat", "look", "pick", "pick2"]
    return chosen


def snapshot(game, result) -> dict:
    """Everything an episode shows, plus the engine's full fact set."""
    return {"feedback": result.feedback, "admissible": result.admissible_commands, "won": result.won,
            "expert": result.expert_action, "accepted": result.accepted,
            "facts": sorted(map(str, game._state["facts"])), "names": dict(game.names)}


def reference_episode(game) -> tuple[list[str], list[dict]]:
    """Play a fresh game: the expert's advice, every fourth step a random admissible
    command, once an unknown command; returns the actions and what each step showed."""
    rng = random.Random(SEED)
    result = game.reset(seed=SEED)
    actions, trace = [], [snapshot(game, result)]
    for k in range(MAX_STEPS):
        if k == 2:
            action = "fly to the moon"
        elif k % 4 == 3 or result.expert_action is None:
            action = rng.choice([c for c in result.admissible_commands if c != "help"])
        else:
            action = result.expert_action
        result = game.step(action)
        actions.append(action)
        trace.append(snapshot(game, result))
        if result.won:
            break
    return actions, trace


def replay(game, actions: list[str]) -> list[dict]:
    result = game.reset(seed=SEED)
    trace = [snapshot(game, result)]
    for action in actions:
        trace.append(snapshot(game, game.step(action)))
    return trace


def scramble(game, steps: int = 8) -> None:
    """An episode of random commands, so that the next reset starts from a changed state."""
    result = game.reset(seed=SEED + 1)
    rng = random.Random(1)
    for _ in range(steps):
        result = game.step(rng.choice([c for c in result.admissible_commands if c != "help"]))


@pytest.mark.exhaustive  # ~2 CPU-minutes
def test_cached_episodes_equal_fresh_loads_on_all_task_types(games, tmp_path, monkeypatch):
    from hp_agent.envs.alfworld import speedups
    from hp_agent.envs.alfworld.engine import AlfworldGame

    monkeypatch.setattr(speedups, "_default_translations", speedups.TranslationCache(tmp_path))
    cached = AlfworldGame(speedups=True)
    previous = None
    for task_type, game_file in games.items():
        fresh = AlfworldGame(game_file, speedups=False)
        actions, expected = reference_episode(fresh)
        fresh.close()
        assert len(actions) >= 3 and expected[1]["accepted"] and not expected[3]["accepted"], task_type

        if previous is not None:  # the engine played another game just before
            cached.load(previous)
            scramble(cached)
        cached.load(game_file)
        assert replay(cached, actions) == expected, f"{task_type}: first cached episode differs"
        scramble(cached)
        assert replay(cached, actions) == expected, f"{task_type}: replay after a changed state differs"
        previous = game_file
    cached.close()
    first = speedups._default_translations
    # Two translations per game (the state task and the replanning task), each done once.
    assert (first.translated, first.from_disk) == (2 * len(games), 0)
    assert first.from_memory >= 2 * 3 * len(games)

    # A new process's cache: everything comes from disk, and plays the same.
    monkeypatch.setattr(speedups, "_default_translations", speedups.TranslationCache(tmp_path))
    again = AlfworldGame(speedups=True)
    for task_type, game_file in games.items():
        fresh = AlfworldGame(game_file, speedups=False)
        actions, expected = reference_episode(fresh)
        fresh.close()
        again.load(game_file)
        assert replay(again, actions) == expected, f"{task_type}: episode from disk-cached translations differs"
    again.close()
    assert speedups._default_translations.translated == 0
    assert speedups._default_translations.from_disk == 2 * len(games)


def test_translation_cache_memory_disk_and_bad_files(games, tmp_path, caplog):
    from hp_agent.envs.alfworld.speedups import TranslationCache

    game_data = json.loads(next(iter(games.values())).read_text())
    domain, problem = game_data["pddl_domain"], game_data["pddl_problem"]
    calls = []

    def counting_translate(domain, problem, verbose=False, optimize=False):
        calls.append(optimize)
        return ("task", f"sas optimize={optimize} {len(problem)}")

    cache = TranslationCache(tmp_path, in_memory=1, translate=counting_translate)
    state = cache(domain, problem)
    assert cache(domain, problem) == state and calls == [False]  # from memory
    replan = cache(domain, problem, optimize=True)  # another key; evicts the first from memory
    assert replan != state and calls == [False, True]
    assert cache(domain, problem) == state and calls == [False, True]  # from disk
    assert (cache.translated, cache.from_disk, cache.from_memory) == (2, 1, 1)
    files = sorted(tmp_path.rglob("*"))
    assert [f.suffix for f in files if f.is_file()] == [".z", ".z"]  # no temporary files left

    # A torn file is translated again and replaced, with a warning.
    for path in tmp_path.rglob("*.z"):
        path.write_bytes(b"not zlib")
    fresh = TranslationCache(tmp_path, translate=counting_translate)
    assert fresh(domain, problem) == state and fresh.translated == 1
    assert "unreadable cached translation" in caplog.text
    assert TranslationCache(tmp_path, translate=counting_translate)(domain, problem) == state
    assert calls == [False, True, False]

    # No disk: memory only.
    memory_only = TranslationCache(None, translate=counting_translate)
    memory_only(domain, problem)
    assert memory_only.translated == 1


def test_engine_speedups_patch_only_inside_the_block(tmp_path):
    import fast_downward
    import textworld.envs.pddl.textgen as textgen

    from hp_agent.envs.alfworld.speedups import TranslationCache, engine_speedups

    shipped = (fast_downward.pddl2sas, textgen._parse_and_convert)
    argv = sys.argv
    cache = TranslationCache(tmp_path)
    with pytest.raises(RuntimeError):
        with engine_speedups(cache):
            assert fast_downward.pddl2sas is cache
            assert textgen._parse_and_convert is not shipped[1]
            sys.argv = ["translate.py", "domain", "task"]  # what every translation does
            raise RuntimeError("an engine error")
    assert (fast_downward.pddl2sas, textgen._parse_and_convert) == shipped
    assert sys.argv is argv
