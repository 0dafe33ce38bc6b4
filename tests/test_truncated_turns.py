"""rollout.truncated_turn: a turn cut at max_new_tokens before its end-of-turn token is
counted (rollout/truncated_turns) and, as configured, trained as sampled (keep), with
zero credit (mask) or as an invalid action (invalid; see tests/test_rollout.py)."""

import pytest

import hp_agent
from hp_agent.config import ConfigError, TrainConfig, load_config
from hp_agent.credit.baseline import HistoricalBaseline
from hp_agent.credit.registry import credit_rule
from hp_agent.files import read_jsonl_records
from hp_agent.hindsight import unreplayed_scores
from hp_agent.credit.assembly import assign_credit
from hp_agent.trainer import rollout_metrics
from hp_agent.trajectory import Trajectory, Turn


def _trajectory(group: int, reward: float, cut: list[bool], shaping: list[float]) -> Trajectory:
    turns = [Turn([], [1, 2], [3, 4], [-1.0, -1.0], "a", shaping=s, truncated=c) for c, s in zip(cut, shaping)]
    return Trajectory("keys", f"task{group}", "boxes", turns=turns, reward=reward, group=group, multi_turn=True)


def _credits(trajectories: list[Trajectory], algo: str, **options) -> list[list[list[float]]]:
    samples, _ = assign_credit(trajectories, unreplayed_scores(trajectories), credit_rule(algo), TrainConfig().credit_options,
                               HistoricalBaseline(initial=0.25), **options)
    return [[sample.credit.tolist() for sample in turns] for turns in samples]


@pytest.mark.parametrize("algo", ["reinforce", "grpo"])
def test_mask_gives_truncated_turns_exactly_zero_credit_and_keeps_the_others(algo):
    trajectories = [_trajectory(0, 1.0, [False, True, False], [0.0, -0.1, 0.0]), _trajectory(0, 0.0, [True, False], [-0.1, 0.0])]
    kept = _credits(trajectories, algo)
    assert _credits(trajectories, algo, mask_truncated=False) == kept  # "keep" is the credit as before
    masked = _credits(trajectories, algo, mask_truncated=True)
    for trajectory, keep_turns, mask_turns in zip(trajectories, kept, masked):
        for turn, keep, mask in zip(trajectory.turns, keep_turns, mask_turns):
            if turn.truncated:
                assert 0.0 not in keep and mask == [0.0, 0.0]
            else:
                assert mask == keep


def test_rollout_metrics_count_the_truncated_turns():
    trajectories = [_trajectory(0, 1.0, [False, True, True], [0.0] * 3), _trajectory(1, 0.0, [True], [0.0])]
    assert rollout_metrics(trajectories)["rollout/truncated_turns"] == 3.0
    assert rollout_metrics(trajectories[:0])["rollout/truncated_turns"] == 0.0


def test_truncated_turn_is_a_documented_choice_defaulting_to_keep():
    assert load_config().rollout.truncated_turn == "keep"
    assert load_config(None, ["rollout.truncated_turn=mask"]).rollout.truncated_turn == "mask"
    with pytest.raises(ConfigError, match="rollout.truncated_turn"):
        load_config(None, ["rollout.truncated_turn=drop"])


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["keep", "mask", "invalid"])
def test_a_training_step_applies_the_choice(tmp_path, choice):
    """keystep with 2 tokens a turn: the random tiny model never ends a turn, so every turn is
    cut. keep: each turn's invalid-action cost (-0.1) is credit, so the step has a gradient;
    mask: all credit is 0, so every gradient record is exactly zero; invalid: every turn is
    sent as an empty action and marked invalid."""
    config = {
        "env": {"name": "keystep"},
        "algo": {"name": "reinforce"},
        "rollout": {"max_new_tokens": 2, "truncated_turn": choice},
        "trainer": {"steps": 1, "prompts_per_step": 2, "run_dir": str(tmp_path), "name": choice, "views_per_step": 0},
    }
    summary = hp_agent.train(config, progress=False)
    metrics = summary.final_metrics
    trajectories = read_jsonl_records(summary.run_dir / "trajectories.jsonl")
    turns = [turn for t in trajectories for turn in t["turns"]]
    assert metrics["rollout/truncated_turns"] == len(turns) == 2 and all(turn["truncated"] for turn in turns)
    assert (metrics["train/zero_grad_records"] == summary.grad_records > 0) == (choice == "mask")
    assert all(turn["invalid"] and turn["shaping"] == -0.1 for turn in turns)  # the env's cost for the cut text too
    for trajectory, turn in zip(trajectories, turns):  # what the env was sent: its feedback quotes it
        sent = "" if choice == "invalid" else turn["action_text"].strip()[:40]
        assert trajectory["feedback"] == f"invalid answer {sent!r}: not an action allowed here"
