"""Scoring an evaluation (Avg@k, Pass@k, intervals, task types) and comparing two: the
one-sided test and what `eval --baseline` prints; a model's evaluation in worker processes."""

from __future__ import annotations

import math

import pytest

from hp_agent.evaluation import EvalResult, change_lines, improvement_p_value, pass_at_k, score, wilson_interval
from hp_agent.trajectory import Trajectory


def _result(successes: int, tasks: int, samples: int = 1, split: str = "test") -> EvalResult:
    rate = successes / (tasks * samples)
    return EvalResult(env="keys", split=split, tasks=tasks, samples=samples, avg_at_k=rate, pass_at_k=rate,
                      success_ci95=wilson_interval(rate * tasks, tasks), mean_reward=rate, invalid_fraction=0.0,
                      mean_turns=2.0)


def test_p_value_falls_as_the_gain_grows_and_a_drop_is_no_gain() -> None:
    p_values = [improvement_p_value(100, 250, after, 250) for after in (90, 100, 110, 125, 150, 200)]
    assert all(a > b for a, b in zip(p_values, p_values[1:]))
    assert p_values[0] > 0.5 and p_values[1] == pytest.approx(0.5)
    assert p_values[3] < 0.05 < p_values[2] and p_values[-1] < 1e-12
    # Swapping the two evaluations turns a gain into a drop: p and 1 - p.
    assert improvement_p_value(150, 250, 100, 250) == pytest.approx(1 - p_values[4])


def test_p_value_matches_the_z_statistic_and_needs_episodes() -> None:
    # 40% -> 60% of 100 each: pooled 0.5, se = sqrt(0.25 * 0.02) = 0.0707, z = 2.828.
    assert improvement_p_value(40, 100, 60, 100) == pytest.approx(0.5 * math.erfc(2.8284 / math.sqrt(2)), rel=1e-3)
    assert improvement_p_value(0, 50, 0, 50) == 1.0 and improvement_p_value(50, 50, 50, 50) == 1.0
    with pytest.raises(ValueError, match="at least one episode"):
        improvement_p_value(0, 0, 1, 1)


def test_change_lines_count_all_samples_and_give_the_verdict() -> None:
    before, after = _result(50, 100, samples=2), _result(150, 100, samples=2)
    lines = change_lines(before, after)
    assert lines[0].startswith("success before: 50/200 = 25.0% [")
    assert lines[1].startswith("success after: 150/200 = 75.0% [")
    assert "+50.0 points" in lines[2] and "beyond evaluation noise" in lines[2]
    same = change_lines(before, _result(52, 100, samples=2))
    assert "no improvement beyond noise" in same[2]
    worse = change_lines(after, before)
    assert "-50.0 points" in worse[2] and "no improvement" in worse[2]


def test_change_lines_refuse_different_tasks() -> None:
    with pytest.raises(ValueError, match="tasks is 100.*80"):
        change_lines(_result(50, 100), _result(40, 80))
    with pytest.raises(ValueError, match="split is 'test'.*'train'"):
        change_lines(_result(50, 100), _result(50, 100, split="train"))


def test_score_counts_avg_and_pass_at_k_per_task_and_orders_task_types() -> None:
    """3 tasks x 8 samples: task 0 wins 3 of 8, task 1 none, task 2 all. Avg@8 pools the
    24 episodes; Pass@8 and the interval count the 3 tasks; types follow the env's order."""
    wins = {0: 3, 1: 0, 2: 8}
    kinds = {0: "stdin", 1: "function", 2: "stdin"}
    trajectories = [Trajectory("code", f"t{g}", kinds[g], group=g, success=k < wins[g], reward=float(k < wins[g]))
                    for g in wins for k in range(8)]
    result = score(trajectories, "code", "test", 8, task_type_order=("stdin", "function"))
    assert (result.tasks, result.samples, result.episodes, result.successes) == (3, 8, 24, 11)
    assert result.avg_at_k == pytest.approx(11 / 24) == pytest.approx(sum(pass_at_k(8, c, 1) for c in wins.values()) / 3)
    assert result.pass_at_k == pytest.approx(2 / 3)
    assert result.success_ci95 == pytest.approx(wilson_interval(11 / 24 * 3, 3))
    assert list(result.per_task_type) == ["stdin", "function"]
    assert result.per_task_type == {"stdin": pytest.approx(11 / 16), "function": 0.0}
    assert result.per_task_type_tasks == {"stdin": 2, "function": 1}
    reordered = score(trajectories, "code", "test", 8)  # no order given: alphabetical
    assert list(reordered.per_task_type) == ["function", "stdin"]


def _played(trajectories: list[Trajectory]) -> list[tuple[str, list[list[int]]]]:
    return [(t.task_id, [turn.action_ids for turn in t.turns]) for t in trajectories]


@pytest.mark.slow
def test_a_model_in_two_processes_plays_contiguous_shares_seeded_as_one_process_would(tiny_policy) -> None:
    """Worker w plays episodes [start, end) as one process playing that share with seed
    ``seed + start`` would: sampled episodes match share by share, greedy ones as a whole."""
    from hp_agent.envs import make
    from hp_agent.evaluation import ModelPlayer, ShardedModelPlayer
    from hp_agent.policies import SamplingParams
    from hp_agent.policies.resolve import resolve_model
    from hp_agent.rollout import Episode

    kwargs = {"split": "test"}
    task_ids = make("keys", **kwargs).task_ids()
    episodes = [Episode(task_ids[i], group=i) for i in range(5)]
    for sampling in (SamplingParams(max_new_tokens=5, temperature=1.0), SamplingParams(max_new_tokens=5, greedy=True)):
        sharded = ShardedModelPlayer(str(resolve_model("tiny")), "keys", kwargs, sampling, 4, 2, 8, "tiny")
        counted: list[int] = []
        both = sharded.play(episodes, 7, counted.append)
        assert sum(counted) == 5
        alone = ModelPlayer(tiny_policy, [make("keys", **kwargs) for _ in range(8)], "keys", sampling, 4, "tiny")
        if sampling.greedy:
            assert _played(both) == _played(alone.play(episodes, 7, lambda n: None))
        else:  # shares of 3 and 2 episodes
            shares = alone.play(episodes[:3], 7, lambda n: None) + alone.play(episodes[3:], 10, lambda n: None)
            assert _played(both) == _played(shares)
            assert _played(both) != _played(alone.play(episodes, 7, lambda n: None))  # the seed is what differs


def test_workers_need_a_model_name_and_a_bad_one_fails_before_any_worker(tiny_policy) -> None:
    from hp_agent.errors import UserError
    from hp_agent.evaluation import evaluate

    with pytest.raises(UserError, match="model="):
        evaluate(env="keys", policy=tiny_policy, workers=2, limit=2)
    with pytest.raises(UserError, match="no-such-folder"):
        evaluate(env="keys", model="./no-such-folder", workers=2, limit=2)
