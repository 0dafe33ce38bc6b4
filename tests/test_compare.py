"""``hp-agent compare``: both methods trained and evaluated at each point, tables and
figures written, an interrupted comparison resumed without redoing anything."""

from __future__ import annotations

import json

import pytest
import yaml

import hp_agent.reports.compare as compare
import hp_agent.trainer
import hp_agent.reports.compare_report as compare_report
from hp_agent.config import ConfigError, TrainConfig
from hp_agent.evaluation import RunPlay
from hp_agent.reports.compare import run_compare
from hp_agent.reports.compare_config import CompareConfig, load_compare_config

# Mechanics on the single-step toy task with the embedded (untrained) model: 2 steps,
# evaluated after each; 2 prompts a step (GRPO: 16 episodes, HP-RLVR: 2).
OVERRIDES = ["trainer.prompts_per_step=2", "rollout.max_new_tokens=5", "trainer.save_trajectories=false",
             "learner.mini_batch_prompts=8"]


def settings(out, **changes) -> CompareConfig:
    fields = {"env": "keystep", "steps": 2, "out": out, "eval_fractions": [0.5, 1.0], "eval_limit": 12,
              "overrides": list(OVERRIDES), **changes}
    return load_compare_config(None, **fields)


def test_eval_points_and_plans(tmp_path):
    config = CompareConfig(env="alfworld", steps=10, out=tmp_path)
    assert config.eval_points() == [2, 5, 8, 10]
    assert config.eval_plan() == [("id", 1), ("ood", 1)]
    assert CompareConfig(env="math", steps=3, out=tmp_path, eval_samples=2).eval_plan() == [("test", 2)]
    assert CompareConfig(env="keys", steps=1, out=tmp_path).eval_points() == [1]
    with pytest.raises(ConfigError, match="eval_fractions"):
        load_compare_config(None, env="keys", steps=4, out=tmp_path, eval_fractions=[0.0, 1.0])
    with pytest.raises(ConfigError, match=r"steps is required \(--steps or in --config\)"):
        load_compare_config(None, env="keys", out=tmp_path)
    with pytest.raises(ConfigError, match="unknown compare setting 'stepz'"):
        load_compare_config(None, env="keys", steps=2, out=tmp_path, stepz=3)
    with pytest.raises(ConfigError, match="trainer.prompts"):
        load_compare_config(None, env="keys", steps=4, out=tmp_path, overrides=["trainer.prompts=3"])


def test_methods_are_named_configurations(tmp_path):
    """A method is a rule's name with its G, or a name with its own rule, G and overrides:
    two configurations of one rule side by side, each its own run folder."""
    config = load_compare_config(None, env="keys", steps=2, out=tmp_path, overrides=["learner.lr=1e-4"], methods={
        "hp-rlvr": 1, "grpo": 8, "hp-rlvr-max": {"algo": "hp-rlvr", "overrides": ["hindsight.weight_norm=max", "learner.lr=2e-4"]},
        "gigpo": {"group_size": 4}})
    assert [config.method(name).algo for name in config.methods] == ["hp-rlvr", "grpo", "hp-rlvr", "gigpo"]
    plain, maxed, gigpo = (config.train_config(name) for name in ("hp-rlvr", "hp-rlvr-max", "gigpo"))
    assert (plain.hindsight.weight_norm, maxed.hindsight.weight_norm) == ("none", "max")
    assert (plain.learner.lr, maxed.learner.lr) == (1e-4, 2e-4)  # the method's own override wins
    assert (maxed.algo.name, maxed.trainer.name, gigpo.algo.group_size) == ("hp-rlvr", "hp-rlvr-max", 4)
    assert config.run_dir("hp-rlvr-max") != config.run_dir("hp-rlvr")
    with pytest.raises(ConfigError, match="unknown credit rule 'nope'"):
        load_compare_config(None, env="keys", steps=2, out=tmp_path, methods={"mine": {"algo": "nope"}})
    with pytest.raises(ConfigError, match="methods"):
        load_compare_config(None, env="keys", steps=2, out=tmp_path, methods={"mine": {"group": 2}})


def test_compare_evaluates_on_the_env_training_only_narrowed():
    """Evaluation keeps the kwargs that define the game and drops the training sample,
    episode cut and shaping reward."""
    train_config = TrainConfig(env={"name": "alfworld", "kwargs": {
        "source": "official", "max_steps": 20, "task_types": ["pick"], "subgoal_reward": 1.0, "prompt_mode": "chat"}})
    assert RunPlay.of(train_config).env_kwargs == {"source": "official", "prompt_mode": "chat"}


@pytest.mark.slow
def test_compare_writes_the_tables_and_resumes_where_it_stopped(tmp_path, monkeypatch, _private_cache):
    out = tmp_path / "cmp"
    evaluate_at = compare._evaluate_at
    calls = []

    def interrupted(config, method, step, progress):
        calls.append((method, step))
        if (method, step) == ("grpo", 1):
            raise KeyboardInterrupt  # a kill in the middle of the first evaluation point
        evaluate_at(config, method, step, progress)

    monkeypatch.setattr(compare, "_evaluate_at", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_compare(settings(out), progress=False)
    monkeypatch.setattr(compare, "_evaluate_at", evaluate_at)
    summary = run_compare(settings(out), progress=False)

    # Nothing was trained twice: one stretch per method and evaluation point.
    segments = [json.loads(line) for line in (out / "segments.jsonl").read_text().splitlines()]
    assert [(s["method"], s["from_step"], s["to_step"]) for s in segments] == [
        ("hp-rlvr", 0, 1), ("grpo", 0, 1), ("hp-rlvr", 1, 2), ("grpo", 1, 2)]
    assert all(s["wall_s"] > 0 and s["cpu_s"] > 0 for s in segments)
    for method in ("hp-rlvr", "grpo"):
        steps = [json.loads(line)["step"] for line in (out / "runs" / method / "metrics.jsonl").read_text().splitlines()]
        assert steps == [0, 1]
        for step in (1, 2):
            result = json.loads((out / "evals" / method / f"step_{step:06d}" / "test.json").read_text())
            assert result["tasks"] == 12 and result["split"] == "test"

    hp, grpo = summary["methods"]["hp-rlvr"], summary["methods"]["grpo"]
    assert (hp["group_size"], grpo["group_size"]) == (1, 8)
    assert hp["trained_steps"] == grpo["trained_steps"] == 2
    # Each method's step time lands in its own phase: hindsight scoring vs behaviour replay.
    assert hp["phases_s"]["hindsight scoring"] > 0 and hp["phases_s"]["behaviour-policy replay"] == 0
    assert grpo["phases_s"]["behaviour-policy replay"] > 0 and grpo["phases_s"]["hindsight scoring"] == 0
    assert grpo["phases_s"]["env stepping"] > 0 and grpo["phases_s"]["rollout generation"] > 0
    # The wall time is the sum of the logged step times; GRPO plays 8x the episodes.
    logged = [json.loads(line)["time/total"] for line in (out / "runs" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert grpo["wall_s"] == pytest.approx(sum(logged))
    # Table 2 reconciles with Table 1: every second of the wall time is in a phase, and the
    # credit viewer (not training's cost) is off.
    for method in (hp, grpo):
        assert sum(method["phases_s"].values()) == pytest.approx(method["wall_s"], rel=1e-6)
    assert settings(out).train_config("hp-rlvr").trainer.views_per_step == 0
    assert summary["over_hp_rlvr"]["grpo"]["wall"] == pytest.approx(grpo["wall_s"] / hp["wall_s"])
    assert [e["episodes"] for e in hp["evaluations"]] == [2, 4] and [e["episodes"] for e in grpo["evaluations"]] == [16, 32]
    cpu = [json.loads(line)["cpu/step_s"] for line in (out / "runs" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert all(c > 0 for c in cpu) and grpo["cpu_s"] == pytest.approx(sum(cpu))
    assert hp["grad_records"] > 0 and grpo["grad_records"] > 0
    assert [e["step"] for e in hp["evaluations"]] == [1, 2]
    assert hp["evaluations"][0]["train_wall_s"] < hp["evaluations"][1]["train_wall_s"]
    assert set(hp["best"]) == {"test success"}
    # The starting model is evaluated once, with the same tasks, for both curves' step 0.
    assert calls[0] == (None, 0)
    start = json.loads((out / "evals" / "start" / "test.json").read_text())
    assert start["tasks"] == 12 and start["policy"] == settings(out).train_config("grpo").model.name
    assert summary["start"]["test success"]["value"] == pytest.approx(start["avg_at_k"])

    report = (out / "report.md").read_text()
    for heading in ("Table 1", "Table 2", "Table 3", "Table 5", "Every evaluation", "One-sided p of a gain", "| metric | start | hp-rlvr | grpo |",
                    "| start | 0 | 0 | 0.0 |", "| grpo | grpo | 8 | 16 |"):
        assert heading in report
    for figure in ("score_vs_time.png", "score_vs_episodes.png", "zero_grad.png", "phases.png"):
        assert (out / figure).read_bytes().startswith(b"\x89PNG")
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))

    # Done: a rerun trains and evaluates nothing; other settings in the same folder are refused.
    train, evaluate = hp_agent.trainer.train, compare.evaluate
    monkeypatch.setattr("hp_agent.trainer.train", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(compare, "evaluate", lambda *a, **k: pytest.fail("evaluated again"))
    run_compare(settings(out), progress=False)
    with pytest.raises(ConfigError, match="steps"):
        run_compare(settings(out, steps=4), progress=False)
    # A method may join the finished comparison (the others are not redone); none may leave or change.
    more = {"hp-rlvr": 1, "grpo": 8, "reinforce": 1}
    with pytest.raises(ConfigError, match="methods"):
        run_compare(settings(out, methods={"hp-rlvr": 1}), progress=False)
    with pytest.raises(ConfigError, match="methods"):
        run_compare(settings(out, methods={"hp-rlvr": 1, "grpo": 4}), progress=False)
    monkeypatch.setattr("hp_agent.trainer.train", train)
    monkeypatch.setattr(compare, "evaluate", evaluate)
    summary = run_compare(settings(out, methods=more), progress=False)
    segments = [json.loads(line) for line in (out / "segments.jsonl").read_text().splitlines()]
    assert [s["method"] for s in segments[4:]] == ["reinforce", "reinforce"]
    assert summary["methods"]["reinforce"]["trained_steps"] == 2 and "| reinforce |" in (out / "report.md").read_text()
    assert yaml.safe_load((out / "compare.yaml").read_text())["methods"] == more


def test_compare_evaluates_as_training_rolls_out(tmp_path, _private_cache):
    """A comparison trained restricted to admissible actions is evaluated restricted: the
    untrained model plays no invalid action then, and mostly invalid ones without it."""
    invalid = {}
    for restricted in (False, True):
        config = load_compare_config(None, env="fetch", steps=1, out=tmp_path / f"restricted-{restricted}", eval_limit=9,
                                     overrides=["rollout.max_new_tokens=8",
                                                f"rollout.constrain_to_admissible={str(restricted).lower()}"])
        compare._evaluate_at(config, None, 0, progress=False)
        results = [json.loads(config.start_eval_path(split).read_text()) for split, _ in config.eval_plan()]
        invalid[restricted] = max(result["invalid_fraction"] for result in results)
    assert invalid[False] > 0.5 and invalid[True] == 0.0


def test_compare_evaluates_in_worker_processes_as_in_one(tmp_path, monkeypatch, _private_cache):
    """``eval_workers`` splits an evaluation over copies of the model: played greedily, the
    split and the one-process evaluation score every episode alike."""
    results, asked = [], []
    evaluate = compare.evaluate
    monkeypatch.setattr(compare, "evaluate", lambda **kwargs: asked.append(kwargs["workers"]) or evaluate(**kwargs))
    for workers in (1, 2):
        config = load_compare_config(None, env="fetch", steps=1, out=tmp_path / f"workers-{workers}", eval_limit=9,
                                     eval_greedy=True, eval_workers=workers, overrides=["rollout.max_new_tokens=8"])
        compare._evaluate_at(config, None, 0, progress=False)
        results.append([json.loads(config.start_eval_path(split).read_text()) for split, _ in config.eval_plan()])
    assert asked == [1] * len(results[0]) + [2] * len(results[1]) and results[0] == results[1]


def test_the_gain_over_the_start_is_one_sided():
    """More wins than the start give p < 0.5, fewer p > 0.5, and the two mirror each other;
    a score without an interval (Pass@k) is not tested."""
    start = {"id success": {"value": 0.1, "ci95": [0.05, 0.2], "tasks": 140},
             "test Pass@4": {"value": 0.5, "ci95": None, "tasks": 140}}
    better = compare_report.gain_p_values(start, {**start, "id success": {**start["id success"], "value": 0.2}})
    worse = compare_report.gain_p_values({"id success": {**start["id success"], "value": 0.2}}, start)
    assert list(better) == ["id success"] and better["id success"] < 0.05
    assert worse["id success"] == pytest.approx(1 - better["id success"])
