"""Offline ALFWorld game sources: synthesized from the alfworld wheel, and rebuilt from ALFRED.

Games are checked on the real engine (textworld PDDL + Fast Downward) with ALFWorld's fixed
handcoded expert, as the build does; the stored walkthroughs are replayed independently.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("textworld")
pytest.importorskip("fast_downward")

from hp_agent.envs.alfworld import build, layouts, pddl, synth  # noqa: E402
from hp_agent.envs.alfworld.data import shared_dir  # noqa: E402

SMALL_SCENES = (14, 316, 416, 202)
ALFRED_TARBALL = shared_dir() / "data" / "alfred_json_2.1.0_trimmed.tar.gz"


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("alfworld_synth")
    # small floor plans (a kitchen, a bedroom with a desk lamp, a bathroom, a living room) keep this quick
    summary = build.build_games(root, source="synth", splits=["train"], counts=6, workers=2, progress=False,
                                scenes=SMALL_SCENES)
    return root, summary


def _replay_walkthrough(game_dir: Path) -> bool:
    from hp_agent.envs.alfworld.engine import AlfworldGame

    data = json.loads((game_dir / "game.tw-pddl").read_text())
    game = AlfworldGame(game_dir / "game.tw-pddl", expert=False)
    try:
        step = game.reset()
        for cmd in data["walkthrough"]:
            assert cmd in step.admissible_commands, (cmd, step.admissible_commands)
            step = game.step(cmd)
        return step.won
    finally:
        game.close()


@pytest.mark.slow
def test_synthesized_games_of_all_six_types_load_and_are_solved(synth_root):
    root, summary = synth_root
    split = summary["splits"]["train"]
    assert split["written"] + split["cached"] == 6
    assert set(split["by_task_type"]) == set(pddl.TASK_TYPES)
    dirs = sorted(p.parent for p in (root / "json_2.1.1" / "train").glob("*/*/game.tw-pddl"))
    assert len(dirs) == 6
    for d in dirs:
        traj = json.loads((d / "traj_data.json").read_text())
        game = json.loads((d / "game.tw-pddl").read_text())
        assert set(game) == {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
        assert game["solvable"] and "UNKNOWN GOAL" not in game["grammar"]
        assert d.parent.name == pddl.TaskSpec.from_traj(traj).folder(traj["scene"]["scene_num"])
        assert 0 < traj["expert_steps"] <= 50  # the fixed expert won within ALFWorld's 50 steps
        assert _replay_walkthrough(d)
    # a second build finds everything in place and does nothing (cached, idempotent)
    again = build.build_games(root, source="synth", splits=["train"], counts=6, workers=1, progress=False,
                              scenes=SMALL_SCENES)
    assert again["splits"]["train"]["cached"] == 6 and again["splits"]["train"]["written"] == 0
    assert not (root / ".tmp_build").exists()


def test_train_and_id_scenes_never_overlap_ood_scenes():
    seen, ood = set(layouts.seen_scenes()), set(layouts.ood_scenes())
    assert ood == {10, 219, 308, 424} and not seen & ood
    assert not seen & layouts.UNSEEN_SCENES
    combos = {"train": set(), "valid_seen": set()}
    for split in ("train", "id", "ood"):
        for i in range(24):
            cand = synth.sample_candidate(split, i, 0)
            assert cand is not None
            scene = cand.state.scene
            assert scene in (ood if split == "ood" else seen), (split, scene)
            if split != "ood":
                key = (cand.task, scene)
                assert synth.combo_split(cand.task, scene) == cand.split_folder
                combos[cand.split_folder].add(key)
    assert not combos["train"] & combos["valid_seen"]


def test_goal_type_without_instance_is_rejected_before_writing(tmp_path):
    from textworld import EnvInfos
    from textworld.envs.pddl import PddlEnv

    cand = synth.sample_candidate("train", 0, 0)
    bad = pddl.TaskSpec("pick_and_place_simple", "Watch" if cand.state.scene < 200 else "Egg",
                        parent_target=cand.task.parent_target or "CounterTop")
    assert not any(o.type == bad.object_target for o in cand.state.objects)
    problems = pddl.check_game(cand.state, bad)
    assert any("val1" in p for p in problems)
    rec = build.materialize(tmp_path, "train", "trial_bad", bad, cand.state, "x", "synth")
    assert rec["status"] == "rejected" and "val1" in rec["reason"]
    assert not (tmp_path / "json_2.1.1").exists() and not list((tmp_path / ".tmp_build").glob("*"))
    # what the check prevents: textworld cannot load such a problem
    env = PddlEnv(EnvInfos(admissible_commands=True))
    with pytest.raises(KeyError, match="val1"):
        env.load(pddl.game_data(pddl.write_problem(cand.state, bad, "bad"), "x"))
        env.reset()


def test_same_seed_gives_the_same_games():
    for split, i in (("train", 3), ("id", 7), ("ood", 5)):
        a, b = synth.sample_candidate(split, i, 0, seed=0), synth.sample_candidate(split, i, 0, seed=0)
        assert a.task == b.task and a.task_desc == b.task_desc
        assert pddl.write_problem(a.state, a.task, "t") == pddl.write_problem(b.state, b.task, "t")
    others = [synth.sample_candidate("train", i, 0, seed=1) for i in range(6)]
    same = [synth.sample_candidate("train", i, 0, seed=0) for i in range(6)]
    assert [pddl.write_problem(c.state, c.task, "t") for c in others] != \
        [pddl.write_problem(c.state, c.task, "t") for c in same]


def test_problem_text_mirrors_official_structure():
    cand = synth.sample_candidate("train", 2, 0)
    text = pddl.write_problem(cand.state, cand.task, "trial_x")
    assert text.startswith("(define (problem plan_trial_x)\n(:domain alfred)\n(:objects\nagent1 - agent")
    parsed = pddl.parse_problem(text)
    assert set(parsed.receptacles) == {r.id for r in cand.state.receptacles}
    assert parsed.parents == {o.id: o.parent for o in cand.state.objects if o.parent}
    assert parsed.agent_loc == pddl.loc_name(cand.state.agent_loc)
    for pred in ("receptacleType", "objectType", "canContain", "pickupable", "atLocation agent1", "inReceptacle",
                 "receptacleAtLocation", "objectAtLocation"):
        assert f"({pred} " in text
    assert "(:goal" in text and "_bar_" in text and "|" not in text


ALFRED_TRIALS = ("look_at_obj_in_light-AlarmClock-None-DeskLamp-323", "pick_and_place_simple-Candle-None-Toilet-429")


@pytest.mark.slow
def test_alfred_rebuild_of_valid_seen_trials_loads_and_is_solved(tmp_path):
    if not ALFRED_TARBALL.exists():
        pytest.skip(f"ALFRED metadata {ALFRED_TARBALL} not available (no /work/shared on this machine)")
    from hp_agent.envs.alfworld import alfred

    with tarfile.open(ALFRED_TARBALL) as tf:
        members = [m for m in tf if "/valid_seen/" in m.name]
        tf.extractall(tmp_path / "alfred", members=members, filter="data")
    catalog = alfred.AlfredCatalog(tmp_path / "alfred")
    trials = [p for p in catalog.trials("valid_seen") if p.parent.parent.name in ALFRED_TRIALS]
    assert len(trials) >= len(ALFRED_TRIALS)
    for path in trials[:len(ALFRED_TRIALS)]:
        built = alfred.rebuild(path, catalog.scene_info(alfred.scene_of(path)))
        traj = json.loads(path.read_text())
        assert built.trial == traj["task_id"] and built.task == pddl.TaskSpec.from_traj(traj)
        assert built.state.agent_loc == layouts.agent_start(traj["scene"]["init_action"]["x"],
                                                            traj["scene"]["init_action"]["z"],
                                                            traj["scene"]["init_action"]["rotation"])
        rec = build.materialize(tmp_path / "out", "valid_seen", built.trial, built.task, built.state,
                                built.task_desc, "alfred")
        assert rec["status"] == "written", rec  # loaded, solved by the expert, walkthrough replayed
        game_dir = tmp_path / "out" / "json_2.1.1" / "valid_seen" / path.parent.parent.name / built.trial
        assert json.loads((game_dir / "traj_data.json").read_text())["task_id"] == built.trial


def test_capped_alfred_build_takes_every_task_type_in_turn():
    trials = [Path(f"train/{kind}-Obj-None-Recep-{k}/trial_{k}/traj_data.json")
              for kind in ("look_at_obj_in_light", "pick_and_place_simple", "pick_two_obj_and_place") for k in range(3)]
    kinds = [path.parent.parent.name.split("-")[0] for path in build.balanced_prefix(trials, 5)]
    assert kinds == ["look_at_obj_in_light", "pick_and_place_simple", "pick_two_obj_and_place",
                     "look_at_obj_in_light", "pick_and_place_simple"]
    assert build.balanced_prefix(trials, 100) == [trials[i] for i in (0, 3, 6, 1, 4, 7, 2, 5, 8)]
