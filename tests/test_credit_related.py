"""The related methods' credit rules (hp_agent/credit/related.py): hand-worked values, and
directions that a flipped sign or a shifted scale would break; one training step each."""

from dataclasses import replace

import pytest
import torch

import hp_agent
from hp_agent.config import load_config
from hp_agent.credit.assembly import turn_states
from hp_agent.credit.baseline import HistoricalBaseline
from hp_agent.credit.registry import credit_rule
from hp_agent.credit.related import discounted_within, gigpo_credit, hcapo_credit, opsd_credit, spo_credit, turn_returns
from hp_agent.credit.rules import CreditBatch, grpo_credit
from hp_agent.files import read_jsonl_records
from hp_agent.trajectory import Trajectory, Turn

OPTIONS = load_config(None, []).credit_options


def _batch(rewards, turn_trajectory, token_turn, groups=None, causal=None, hindsight=None, turn_state=None,
           shaping=None, baselines=None) -> CreditBatch:
    rewards = torch.tensor(rewards, dtype=torch.float32)
    turn_trajectory, token_turn = torch.tensor(turn_trajectory), torch.tensor(token_turn)
    return CreditBatch(rewards, torch.zeros_like(rewards) if baselines is None else torch.tensor(baselines),
                       torch.zeros(len(rewards), dtype=torch.long) if groups is None else torch.tensor(groups),
                       turn_trajectory, torch.zeros(len(turn_trajectory)) if shaping is None else torch.tensor(shaping),
                       token_turn,
                       causal_logprobs=None if causal is None else torch.tensor(causal),
                       hindsight_logprobs=None if hindsight is None else torch.tensor(hindsight),
                       turn_state=None if turn_state is None else torch.tensor(turn_state))


def test_opsd_credit_is_the_clipped_teacher_minus_student_log_prob_plus_shaping():
    batch = _batch([1.0], [0, 0], [0, 0, 1], causal=[-2.0, -0.1, -1.0], hindsight=[-1.0, -3.0, -1.0], shaping=[0.0, -0.1])
    credit, _ = opsd_credit(batch, replace(OPTIONS, opsd_clip=1.5, opsd_discount=0.0))
    assert credit.tolist() == pytest.approx([1.0, -1.5, -0.1])
    flipped = replace(batch, causal_logprobs=batch.hindsight_logprobs, hindsight_logprobs=batch.causal_logprobs)
    assert opsd_credit(flipped, replace(OPTIONS, opsd_clip=1.5, opsd_discount=0.0))[0].tolist() == pytest.approx([-1.0, 1.5, -0.1])
    # discounted: each token also gets the later tokens' clipped ratios, 0.5 a token
    discounted, _ = opsd_credit(batch, replace(OPTIONS, opsd_clip=1.5, opsd_discount=0.5))
    assert discounted.tolist() == pytest.approx([1.0 + 0.5 * (-1.5), -1.5, -0.1])
    with pytest.raises(ValueError, match="both views"):
        opsd_credit(replace(batch, hindsight_logprobs=None), OPTIONS)


def test_discounted_sums_stop_at_each_owners_end():
    values, owner = torch.tensor([1.0, 2.0, 4.0, 8.0]), torch.tensor([0, 0, 1, 1])
    assert discounted_within(values, owner, 1.0).tolist() == [3.0, 2.0, 12.0, 8.0]
    assert discounted_within(values, owner, 0.0).tolist() == values.tolist()


def test_hcapo_scales_grpo_by_the_clipped_hindsight_ratio():
    """A won and a lost rollout of one prompt: equal views give GRPO; a ratio above 1 gives
    the winner more credit and the loser more blame; the clip bounds both."""
    equal = _batch([1.0, 0.0], [0, 1], [0, 0, 1, 1], causal=[-1.0] * 4, hindsight=[-1.0] * 4)
    grpo, _ = grpo_credit(equal, OPTIONS)
    assert torch.allclose(hcapo_credit(equal, OPTIONS)[0], grpo)
    log_ratio = torch.tensor([0.5, -0.5, 0.5, 9.0])
    shifted = replace(equal, hindsight_logprobs=equal.causal_logprobs + log_ratio)
    credit, metrics = hcapo_credit(shifted, replace(OPTIONS, hcapo_ratio_clip=2.0))
    expected = grpo * torch.tensor([0.5, -0.5, 0.5, 9.0]).exp().clamp(0.5, 2.0)
    assert torch.allclose(credit, expected)
    assert credit[0] > grpo[0] > 0 > grpo[2] > credit[2]  # likelier in hindsight: more credit, more blame
    assert credit[3] == pytest.approx(2.0 * grpo[3].item())  # e^9 clipped at 2
    assert 0 < metrics["credit/hindsight_ratio_mean"] <= 2.0


def test_gigpo_adds_the_step_advantage_of_anchor_states():
    """Two rollouts of one prompt, both starting in state A; the winner reaches the goal
    from A in 2 turns, the loser wanders (states B, C). Hand values at gamma 0.5, no std:
    step returns from A are 0.5 (win at the 2nd turn) and 0; B and C are no anchors."""
    batch = _batch([1.0, 0.0], [0, 0, 1, 1], [0, 1, 2, 3], turn_state=[0, 1, 0, 2])
    options = replace(OPTIONS, grpo_scale_by_std=False, gigpo_step_weight=1.0, gigpo_discount=0.5)
    credit, metrics = gigpo_credit(batch, options)
    assert credit.tolist() == pytest.approx([0.5 + 0.25, 0.5, -0.5 - 0.25, -0.5])
    assert metrics["credit/anchor_turn_fraction"] == 0.5
    assert torch.allclose(gigpo_credit(batch, replace(options, gigpo_step_weight=0.0))[0],
                          grpo_credit(batch, options)[0])  # without the step term: GRPO
    # the same state in another prompt group is another anchor: no step advantage across groups
    apart = replace(batch, groups=torch.tensor([0, 1]))
    assert gigpo_credit(apart, options)[1]["credit/anchor_turn_fraction"] == 0.0
    with pytest.raises(ValueError, match="turn_state"):
        gigpo_credit(replace(batch, turn_state=None), options)


def test_turn_returns_discount_shaping_and_the_outcome():
    batch = _batch([10.0, 0.0], [0, 0, 0, 1], [0, 1, 2, 3], shaping=[1.0, 0.0, 0.0, -0.1])
    assert turn_returns(batch, 0.5).tolist() == pytest.approx([1.0 + 0.25 * 10.0, 0.5 * 10.0, 10.0, -0.1])


def test_turn_states_are_the_observations_each_action_answered():
    def turn(observation):
        return Turn([], [], [1], [0.0], "a", "a", observation)

    won = Trajectory("alfworld", "g", "pick", [turn("You arrive at desk 1."), turn("Nothing happens."), turn("")], 10.0, "", True)
    lost = Trajectory("alfworld", "g", "pick", [turn("Nothing happens."), turn("You arrive at desk 1.")], 0.0, "", False)
    # start, desk, nothing | start, nothing: the starts are one state, "Nothing happens." is one state
    assert turn_states([won, lost]) == [0, 1, 2, 0, 2]


def test_spo_centers_on_the_tracker_and_scales_by_the_batch_std():
    batch = _batch([1.0, 0.0, 1.0], [0, 1, 2], [0, 1, 2], groups=[0, 1, 2], baselines=[0.25, 0.5, 1.0])
    credit, _ = spo_credit(batch, OPTIONS)
    centered = torch.tensor([0.75, -0.5, 0.0])
    assert torch.allclose(credit, centered / centered.std(), atol=1e-5)
    # rewards and baselines on another scale give the same credit; shaping adds on top
    scaled = replace(batch, rewards=batch.rewards * 10, baselines=batch.baselines * 10, turn_shaping=torch.tensor([0.0, -0.1, 0.0]))
    assert torch.allclose(spo_credit(scaled, OPTIONS)[0], credit + torch.tensor([0.0, -0.1, 0.0]), atol=1e-5)


def test_the_decaying_tracker_is_a_discounted_mean():
    """rho = 0.5, no prior: after rewards 1, 0, 1 the count is 1 + 0.5 + 0.25 and the value the
    discounted mean (1 * 0.25 + 0 * 0.5 + 1 * 1) / 1.75; the undecayed rule gives the plain mean."""
    tracker, plain = HistoricalBaseline(prior_weight=0.0, decay=0.5), HistoricalBaseline(prior_weight=0.0, rate=0.01)
    for reward in (1.0, 0.0, 1.0):
        tracker.update("keys", "t", "task", reward)
        plain.update("keys", "t", "task", reward)
    count, value = tracker.estimates["task:keys/task"]
    assert count == pytest.approx(1.75) and value == pytest.approx(1.25 / 1.75)
    assert plain.value("keys", "t", "task") == pytest.approx(2 / 3)
    restored = HistoricalBaseline()
    restored.load_state_dict(tracker.state_dict())
    assert restored.decay == 0.5 and restored.estimates == tracker.estimates


def test_spo_runs_with_its_decay_and_the_others_keep_theirs():
    assert load_config(None, ["algo.name=spo"]).baseline.decay == 0.9
    assert load_config(None, ["algo.name=spo", "baseline.decay=0.5"]).baseline.decay == 0.5
    assert load_config(None, ["algo.name=hp-rlvr"]).baseline.decay is None
    assert credit_rule("opsd").hindsight and credit_rule("hcapo").hindsight
    assert credit_rule("gigpo").min_group_size == credit_rule("hcapo").min_group_size == 2


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["opsd", "hcapo", "gigpo", "spo", "grpo+sampled", "grpo+topk", "grpo+full"])
def test_one_training_step_of_each_rule(tmp_path, algo):
    """Multi-turn (keys), so that GiGPO finds anchor states and OPSD's hindsight has a future;
    GRPO with each distillation term scores hindsight, which GRPO alone does not."""
    algo, _, distill = algo.partition("+")
    grouped = algo in ("hcapo", "gigpo", "grpo")
    summary = hp_agent.train({
        "env": {"name": "keys"}, "algo": {"name": algo, **({"group_size": 4} if grouped else {})},
        "rollout": {"max_new_tokens": 16},
        "learner": {"lr": 1e-4, **({"distill_coef": 0.1, "distill": distill} if distill else {})},
        "trainer": {"steps": 1, "prompts_per_step": 2, "run_dir": str(tmp_path), "name": algo, "checkpoint_every": 1},
    }, progress=False)
    (metrics,) = read_jsonl_records(summary.run_dir / "metrics.jsonl")
    assert metrics["train/optimizer_steps"] == 1
    key = {"opsd": "credit/hindsight_log_ratio_mean", "hcapo": "credit/hindsight_ratio_mean",
           "gigpo": "credit/anchor_turn_fraction", "spo": "credit/centered_reward", "grpo": "loss/distill_kl"}[algo]
    key = "loss/distill_jsd" if distill in ("topk", "full") else key
    assert key in metrics
    if algo == "gigpo":
        assert metrics[key] > 0  # four rollouts of a task share at least their start
