"""Learner: token in, token out; masks; zero gradients; micro-batch invariance; bad steps."""

import copy
import math
from dataclasses import replace

import pytest
import torch

from hp_agent import TextEnv, Verdict
from hp_agent.config import TrainConfig
from hp_agent.credit.baseline import HistoricalBaseline
from hp_agent.credit.registry import CREDIT_RULES, credit_rule, register_credit
from hp_agent.envs import make
from hp_agent.hindsight import ScoringOptions, score_trajectories
from hp_agent.learner import Learner, TrainingSample, clipped_policy_loss
from hp_agent.policies import SamplingParams, load_policy
from hp_agent.rollout import Episode, collect
from hp_agent.credit.assembly import assign_credit
from hp_agent.trainer import TrainingError, _account_grad_records


@pytest.fixture()
def policy():
    torch.manual_seed(0)
    return load_policy("tiny")


def _rollouts(policy, tasks=3, group=1, max_new_tokens=24):
    envs = [make("math", split="train") for _ in range(tasks * group)]
    episodes = [Episode(task_id, g) for g, task_id in enumerate(envs[0].task_ids()[:tasks]) for _ in range(group)]
    return collect(policy, envs, "math", episodes, SamplingParams(max_new_tokens=max_new_tokens))


def _learner(policy, micro_batch_tokens=4096, lr=1e-3, mini_batch_prompts=1000, group_size=1, record_batch_size=8,
             **learner):
    """The config's learner with these keys (``learner``: further ``learner`` section keys)."""
    config = TrainConfig.model_validate({"algo": {"group_size": group_size}, "learner": {
        "lr": lr, "max_grad_norm": 1e9, "micro_batch_tokens": micro_batch_tokens, "mini_batch_prompts": mini_batch_prompts,
        "record_batch_size": record_batch_size, **learner}})
    return Learner.from_config(policy, config)


def _credit(trajectories, scores, algo="hp-rlvr", baseline=None):
    return assign_credit(trajectories, scores, credit_rule(algo), TrainConfig().credit_options, baseline or HistoricalBaseline())


def test_learner_trains_on_the_sampled_token_ids(policy):
    trajectories = _rollouts(policy)
    scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    samples, _ = _credit(trajectories, scores, baseline=HistoricalBaseline(initial=0.5))
    assert len(samples) == len(trajectories)
    for (sample,), trajectory, score in zip(samples, trajectories, scores):
        turn = trajectory.turns[0]
        assert turn.prompt_ids == policy.render(turn.prompt_messages)  # prompt as rendered at generation
        assert sample.input_ids == turn.prompt_ids + turn.action_ids  # never re-tokenized text
        assert sample.action_start == len(turn.prompt_ids)
        assert sample.credit.shape == sample.old_logprobs.shape == (len(turn.action_ids),)
        # behaviour log-probs from the snapshot agree with what the sampler reported
        assert torch.allclose(score.causal_logprobs[0], torch.tensor(turn.sample_logprobs), atol=1e-3)


def test_zero_credit_tokens_never_contribute():
    # Zero credit is the eligibility mask (credit.zero_turn_credit): such a token adds no loss and no gradient.
    logprobs = torch.randn(2, 6, requires_grad=True)
    old = logprobs.detach() + 0.05 * torch.randn(2, 6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]]).bool()
    credit = torch.where(mask, torch.randn(2, 6), torch.zeros(2, 6))
    loss, _ = clipped_policy_loss(logprobs, old, credit, 0.2, 0.28, 3.0, num_eligible=int(mask.sum()))
    kept, _ = clipped_policy_loss(logprobs[mask], old[mask], credit[mask], 0.2, 0.28, 3.0)
    assert torch.allclose(loss, kept)
    loss.backward()
    assert bool((logprobs.grad[~mask] == 0).all()) and bool((logprobs.grad[mask] != 0).all())


def test_clipped_loss_hand_values():
    old = torch.zeros(3)
    logprobs = torch.log(torch.tensor([1.5, 0.5, 1.1]))  # ratios 1.5, 0.5, 1.1
    credit = torch.tensor([1.0, -1.0, 2.0])
    loss, metrics = clipped_policy_loss(logprobs, old, credit, 0.2, 0.28, 3.0)
    # min(1.5, 1.28) * 1 = 1.28; min(0.5 * -1, 0.8 * -1) = -0.8; min(2.2, 2.2) = 2.2
    assert loss.item() == pytest.approx(-(1.28 - 0.8 + 2.2) / 3)
    assert metrics["loss/clip_fraction"] == pytest.approx(2 / 3)


def test_dual_clip_bounds_negative_credit_only():
    """A negative-credit token whose ratio passed C keeps the term C * c and no gradient;
    below C, and for positive credit, the loss is the plain clipped one."""
    old = torch.zeros(4)
    ratios = torch.tensor([5.0, 2.0, 5.0, 0.5])
    credit = torch.tensor([-1.0, -1.0, 1.0, -1.0])
    logprobs = torch.log(ratios).requires_grad_()
    loss, metrics = clipped_policy_loss(logprobs, old, credit, 0.2, 0.28, clip_ratio_c=3.0)
    # -3 (dual clip), -2 (unclipped: min(-2, -1.28)), min(5, 1.28) = 1.28, min(-0.5, -0.8) = -0.8
    assert loss.item() == pytest.approx(-(-3.0 - 2.0 + 1.28 - 0.8) / 4)
    assert metrics["loss/ratio_max"] == pytest.approx(5.0)
    loss.backward()
    assert logprobs.grad[0] == 0 and logprobs.grad[2] == 0  # dual-clipped, upper-clipped
    assert logprobs.grad[1] > 0  # lowering a negative-credit token's probability lowers the loss
    plain, _ = clipped_policy_loss(torch.log(ratios), old, credit, 0.2, 0.28, clip_ratio_c=None)
    assert plain.item() == pytest.approx(-(-5.0 - 2.0 + 1.28 - 0.8) / 4)


def test_zero_credit_gives_an_exact_zero_gradient(policy):
    trajectories = _rollouts(policy, tasks=2, group=4)
    for trajectory in trajectories:  # every member of each group failed alike
        trajectory.reward, trajectory.success = 0.0, False
    scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=False)
    samples, metrics = _credit(trajectories, scores, "grpo")
    assert metrics["credit/degenerate_group_fraction"] == 1.0
    before = copy.deepcopy(policy.model.state_dict())
    (record,) = _learner(policy).step(samples)
    assert record.grad_norm == 0.0 and not record.skipped_nonfinite
    after = policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_micro_batching_does_not_change_the_update(policy):
    trajectories = _rollouts(policy, tasks=4)
    scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    samples, _ = _credit(trajectories, scores, baseline=HistoricalBaseline(initial=0.5))
    other = copy.deepcopy(policy)
    (whole,) = _learner(policy, micro_batch_tokens=100_000).step(samples)
    (pieces,) = _learner(other, micro_batch_tokens=64).step(samples)
    assert whole.grad_norm > 0
    assert whole.grad_norm == pytest.approx(pieces.grad_norm, rel=1e-4)
    # Compare the accumulated gradients: Adam's first step, ~lr * sign(g), would turn
    # float rounding in near-zero gradients into visible weight differences.
    for (name, a), b in zip(policy.model.named_parameters(), other.model.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-7), name


def test_nonfinite_step_is_skipped_then_training_stops(policy, tmp_path):
    sample = TrainingSample(
        input_ids=policy.render([{"role": "user", "content": "hi"}]) + [5, 6, 7],
        action_start=len(policy.render([{"role": "user", "content": "hi"}])),
        old_logprobs=torch.zeros(3),
        credit=torch.tensor([float("nan"), 1.0, 1.0]),
    )
    before = copy.deepcopy(policy.model.state_dict())
    (record,) = _learner(policy).step([[sample]])
    assert record.skipped_nonfinite
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())

    from hp_agent.runs import JsonlLog

    log = JsonlLog(tmp_path / "g.jsonl")
    totals = {"zero_grad_records": 0, "grad_records": 0, "nonfinite_in_a_row": 0}
    _account_grad_records([record], totals, 0, log, max_nonfinite=2)
    with pytest.raises(TrainingError, match="not finite in 2 optimizer steps in a row"):
        _account_grad_records([record], totals, 1, log, max_nonfinite=2)


class TwoSteps(TextEnv):
    """Two turns, then a failure verdict. Odd seeds make the second action invalid
    (shaping -0.1, a cost), whatever the policy wrote, so the test controls validity."""

    max_turns = 2

    def task_ids(self):
        return ["t"]

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.turn, self.odd = 0, bool((seed or 0) % 2)
        return "go", {"task_id": "t", "task_type": "steps"}

    def step(self, action):
        self.turn += 1
        invalid = self.odd and self.turn == 2
        done = self.turn == 2
        info = {"invalid_action": invalid, "shaping": -0.1 if invalid else 0.0}
        if done:
            info["verdict"] = Verdict(0.0, "failure", False)
        return "next", info["shaping"], done, False, info


def _two_step_rollouts(policy, episodes):
    trajectories = collect(policy, [TwoSteps() for _ in episodes], "steps", episodes, SamplingParams(max_new_tokens=4), seed=0)
    assert [t.turns[1].invalid for t in trajectories] == [k % 2 == 1 for k in range(len(episodes))]
    return trajectories


def test_invalid_turn_lowers_hp_rlvr_credit_from_env_to_learner(tiny_policy):
    """Env -> rollout -> credit: the invalid turn's tokens get exactly 0.1 less credit.

    One failed trajectory alone in the run's first step is centered on its own reward
    (R - b = 0), so its credit is the shaping alone: 0 on the valid turn, -0.1 on the
    invalid one. A flipped sign anywhere on the way makes the invalid turn's credit higher.
    """
    (trajectory,) = _two_step_rollouts(tiny_policy, [Episode("t"), Episode("t")])[1:]
    scores = score_trajectories(tiny_policy, [trajectory], ScoringOptions.from_config(), with_hindsight=True)
    ([valid, invalid],), metrics = _credit([trajectory], scores)
    assert torch.equal(valid.credit, torch.zeros_like(valid.credit))
    assert torch.allclose(invalid.credit, torch.full_like(invalid.credit, -0.1))
    assert metrics["credit/invalid_turns_mean"] == pytest.approx(-0.1) and metrics["credit/valid_turns_mean"] == 0.0


def test_grpo_gives_the_failed_rollout_with_an_invalid_turn_the_lower_advantage(tiny_policy):
    trajectories = _two_step_rollouts(tiny_policy, [Episode("t", group=0), Episode("t", group=0)])
    scores = score_trajectories(tiny_policy, trajectories, ScoringOptions.from_config(), with_hindsight=False)
    (clean, _), (costly, _) = _credit(trajectories, scores, "grpo")[0]
    assert clean.credit.min() > 0 > costly.credit.max()
    assert float(clean.credit[0]) == pytest.approx(-float(costly.credit[0]))


def test_a_registered_credit_rule_plugs_in_without_trainer_changes(tiny_policy):
    trajectories = _two_step_rollouts(tiny_policy, [Episode("t"), Episode("t")])
    scores = score_trajectories(tiny_policy, trajectories, ScoringOptions.from_config(), with_hindsight=False)

    @register_credit("test-turn-index")
    def turn_index(batch, options):
        return batch.token_turn.float(), {"credit/custom": 1.0}

    try:
        samples, metrics = _credit(trajectories, scores, "test-turn-index")
    finally:
        del CREDIT_RULES["test-turn-index"]
    assert metrics["credit/custom"] == 1.0
    assert [float(turn.credit[0]) for turns in samples for turn in turns] == [0.0, 1.0, 2.0, 3.0]


def test_a_tied_group_gives_exactly_its_zero_record_next_to_a_split_one(policy):
    """GRPO with 2 prompts x 4 rollouts in one optimizer step, records of 4 slots: the
    first prompt's group ties (its record is exactly zero), the second's does not; the
    step's gradient is the second record's alone. Records of 1 slot: 8 records."""
    trajectories = _rollouts(policy, tasks=2, group=4)
    for k, trajectory in enumerate(trajectories):
        trajectory.reward = 0.0 if k < 4 else float(k % 2)
    scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=False)
    samples, _ = _credit(trajectories, scores, "grpo")
    (step,) = _learner(copy.deepcopy(policy), mini_batch_prompts=2, group_size=4, record_batch_size=4).step(samples)
    tied, split = step.record_norms
    assert tied == 0.0 and split > 0.0 and step.grad_norm == pytest.approx(split, rel=1e-5)
    (step,) = _learner(copy.deepcopy(policy), mini_batch_prompts=2, group_size=4, record_batch_size=1).step(samples)
    assert len(step.record_norms) == 8 and step.record_norms[:4] == [0.0] * 4 and min(step.record_norms[4:]) > 0.0
    # A dropped trajectory of the tied group moves no other trajectory into its record.
    (step,) = _learner(copy.deepcopy(policy), mini_batch_prompts=2, group_size=4, record_batch_size=4).step(
        samples[1:], slots=list(range(1, 8)))
    tokens = [sum(s.num_action_tokens for s in turns) for turns in samples]
    # the same contribution, normalised by the mini-batch's fewer tokens
    assert step.record_norms[0] == 0.0 and step.record_norms[1] == pytest.approx(split * sum(tokens) / sum(tokens[1:]),
                                                                               rel=1e-5)


def test_learner_and_scoring_are_built_from_their_config_sections(tiny_policy):
    from hp_agent.config import load_config

    config = load_config(None, ["learner.lr=3e-4", "learner.mini_batch_prompts=4", "learner.max_grad_norm=0.5",
                                "algo.clip_eps_high=0.3", "algo.clip_ratio_c=null", "rollout.temperature=0.7",
                                "hindsight.future_turns=3", "hindsight.score_batch_tokens=2048", "hindsight.packed=false"])
    learner = Learner.from_config(tiny_policy, config)
    assert learner.optimizer.param_groups[0]["lr"] == 3e-4 and learner.mini_batch_prompts == 4
    assert (learner.max_grad_norm, learner.clip_eps_high, learner.clip_ratio_c, learner.model.module.temperature) == (0.5, 0.3, None, 0.7)
    scoring = ScoringOptions.from_config(config)
    assert (scoring.future_turns, scoring.score_batch_tokens, scoring.packed, scoring.temperature) == (3, 2048, False, 0.7)
    assert scoring.max_block_tokens == config.hindsight.max_block_tokens


def _decoder_layer_calls(policy) -> list[torch.dtype]:
    """Record the output dtype of every forward call of the first decoder layer's q_proj."""
    calls: list[torch.dtype] = []
    layer = policy.model.get_decoder().layers[0].self_attn.q_proj
    layer.register_forward_hook(lambda module, args, output: calls.append(output.dtype))
    return calls


def test_activation_checkpointing_recomputes_layers_and_keeps_the_gradients(policy):
    trajectories = _rollouts(policy, tasks=3)
    scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    samples, _ = _credit(trajectories, scores, baseline=HistoricalBaseline(initial=0.5))
    other = copy.deepcopy(policy)
    plain_calls, checkpointed_calls = _decoder_layer_calls(policy), _decoder_layer_calls(other)
    (plain,) = _learner(policy).step(samples)
    (checkpointed,) = _learner(other, activation_checkpointing=True).step(samples)
    assert len(checkpointed_calls) == 2 * len(plain_calls) > 0  # each layer runs again in backward
    assert plain.grad_norm > 0 and checkpointed.grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)
    for (name, a), b in zip(policy.model.named_parameters(), other.model.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-7), name


def test_mixed_precision_computes_in_bfloat16_on_float32_master_weights():
    torch.manual_seed(0)
    rollout_policy = load_policy("tiny", dtype="bfloat16")
    trajectories = _rollouts(rollout_policy, tasks=3)
    scores = score_trajectories(rollout_policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    samples, _ = _credit(trajectories, scores, baseline=HistoricalBaseline(initial=0.5))
    pure_bf16 = copy.deepcopy(rollout_policy)
    start = {k: v.float().clone() for k, v in rollout_policy.model.state_dict().items()}
    calls = _decoder_layer_calls(rollout_policy)
    mixed = _learner(rollout_policy, lr=1e-5, mixed_precision=True)
    for _ in range(3):
        mixed.step(samples)
    _learner(pure_bf16, lr=1e-5, mixed_precision=False).step(samples)
    for _ in range(2):
        _learner(pure_bf16, lr=1e-5, mixed_precision=False).step(samples)
    master = dict(mixed.model.trained.named_parameters())
    assert all(p.dtype == torch.float32 for p in master.values())  # master weights and AdamW state in float32
    assert all(state["exp_avg"].dtype == torch.float32 for state in mixed.optimizer.state.values())
    assert set(calls) == {torch.bfloat16}  # the learner's forward ran in bfloat16 (so did rollout)
    name = "model.layers.0.mlp.up_proj.weight"
    moved_master = (master[name].detach() != start[name]).float().mean().item()
    moved_bf16 = (pure_bf16.model.state_dict()[name].float() != start[name]).float().mean().item()
    # Steps of about lr = 1e-5 round away in bfloat16 for most weights; the fp32 master keeps them.
    assert moved_master > 0.9 and moved_bf16 < 0.5, (moved_master, moved_bf16)
    # The rollout model got the master weights, rounded to its bfloat16.
    published = rollout_policy.model.state_dict()[name]
    assert published.dtype == torch.bfloat16 and torch.equal(published, master[name].detach().to(torch.bfloat16))


def test_a_grpo_step_without_replay_takes_the_replayed_step(policy):
    """One optimizer step runs on the weights that sampled: the learner's own log-probs,
    detached, are the behaviour log-probs a replay pass would compute (ratio exactly 1)."""
    from hp_agent.hindsight import unreplayed_scores

    trajectories = _rollouts(policy, tasks=2, group=4)
    for i, trajectory in enumerate(trajectories):  # both groups split, so every advantage is nonzero
        trajectory.reward, trajectory.success = float(i % 2), bool(i % 2)
    replayed, _ = _credit(trajectories, score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=False),
                          "grpo")
    unreplayed, _ = _credit(trajectories, unreplayed_scores(trajectories), "grpo")
    assert all(s.old_logprobs is None for turns in unreplayed for s in turns)
    other = copy.deepcopy(policy)
    (with_replay,) = _learner(policy).step(replayed)
    (without,) = _learner(other).step(unreplayed)
    assert with_replay.grad_norm > 0 and without.grad_norm == pytest.approx(with_replay.grad_norm, rel=1e-4)
    assert without.metrics["loss/ratio_mean"] == without.metrics["loss/ratio_max"] == 1.0
    for (name, a), b in zip(policy.model.named_parameters(), other.model.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-7), name


def _synthetic_batch(prompts: int, group: int, seed: int = 0, replayed: bool = True) -> list[list[TrainingSample]]:
    """One one-turn trajectory per rollout slot: random ids, credit of either sign, and
    (``replayed``) behaviour log-probs."""
    generator = torch.Generator().manual_seed(seed)
    batch = []
    for _ in range(prompts * group):
        ids = torch.randint(5, 200, (12,), generator=generator).tolist()
        old = -torch.rand(4, generator=generator) if replayed else None
        batch.append([TrainingSample(ids, 8, old, torch.randn(4, generator=generator))])
    return batch


def test_the_learner_needs_behaviour_logprobs_once_a_batch_takes_several_optimizer_steps(tiny_policy):
    learner = _learner(tiny_policy, mini_batch_prompts=4, group_size=2)
    assert [learner.needs_behaviour_logprobs(prompts) for prompts in (1, 4, 5, 8, 9)] == [False, False, True, True, True]


def test_a_batch_of_several_optimizer_steps_without_behaviour_logprobs_is_refused_before_any_step(tiny_policy):
    """Without old_logprobs the ratio is 1 by construction: right in the first optimizer
    step, silently wrong in the later ones (stale weights), so the learner refuses."""
    learner = _learner(copy.deepcopy(tiny_policy), mini_batch_prompts=2, group_size=2)
    before = {name: p.detach().clone() for name, p in learner.policy.model.named_parameters()}
    with pytest.raises(ValueError, match=r"2 optimizer steps.*learner\.mini_batch_prompts=2.*trainer\.prompts_per_step"):
        learner.step(_synthetic_batch(3, 2, replayed=False))
    assert all(torch.equal(p, before[name]) for name, p in learner.policy.model.named_parameters())
    assert len(learner.step(_synthetic_batch(2, 2, replayed=False))) == 1  # one step: its own log-probs stand in
    assert len(learner.step(_synthetic_batch(3, 2))) == 2  # replayed: both steps train


@pytest.mark.parametrize("prompts, grpo_records, hp_records", [(4, 4, 1), (16, 16, 2)])
def test_both_methods_take_the_same_optimizer_steps_at_equal_prompts(tiny_policy, prompts, grpo_records, hp_records):
    """Mini-batches of 8 prompts (the default): GRPO's 8 rollouts a prompt do not add
    optimizer steps, only gradient records (8 slots each: G times HP-RLVR's where a
    mini-batch has 8 prompts)."""
    steps = {}
    for name, group in (("hp-rlvr", 1), ("grpo", 8)):
        learner = _learner(copy.deepcopy(tiny_policy), mini_batch_prompts=8, group_size=group, record_batch_size=8)
        assert learner.optimizer_steps(prompts) == -(-prompts // 8)
        records = learner.step(_synthetic_batch(prompts, group))
        steps[name] = (len(records), sum(len(r.record_norms) for r in records))
    assert steps == {"hp-rlvr": (-(-prompts // 8), hp_records), "grpo": (-(-prompts // 8), grpo_records)}


def test_a_low_precision_model_trains_float32_master_weights_by_default():
    """model.dtype=bfloat16 with no precision key: AdamW steps float32 master weights, so
    steps of about lr = 1e-5 move essentially every weight of a layer (pure bfloat16, as
    learner.mixed_precision=false asks, rounds most of them away)."""
    from hp_agent.config import load_config

    moved = {}
    for overrides in ([], ["learner.mixed_precision=false"]):
        torch.manual_seed(0)
        policy = load_policy("tiny", dtype="bfloat16")
        config = load_config(None, ["model.dtype=bfloat16", "learner.lr=1e-5", "learner.max_grad_norm=1e9", *overrides])
        learner = Learner.from_config(policy, config)
        name = "model.layers.0.mlp.up_proj.weight"
        start = policy.model.state_dict()[name].float().clone()
        for seed in range(3):
            learner.step(_synthetic_batch(4, 1, seed))
        trained = dict(learner.model.trained.named_parameters())[name].detach().float()
        moved[config.learner.mixed_precision] = (trained != start).float().mean().item()
    assert moved[True] > 0.9 and moved[False] < 0.5, moved


def test_distillation_moves_each_sampled_token_toward_the_teacher(policy):
    """learner.distill_coef with zero credit: one step raises the log-prob of the sampled
    tokens the hindsight teacher holds likelier than the policy and lowers the others'; the
    credit rule's term alone (coefficient 0) does nothing; and the teacher is required."""
    trajectories = _rollouts(policy, tasks=2)
    scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    samples, _ = _credit(trajectories, scores)
    assert all(torch.equal(s.teacher_logprobs, score.hindsight_logprobs[0]) for (s,), score in zip(samples, scores))
    own = [[replace(s, credit=torch.zeros_like(s.credit)) for s in turns] for turns in samples]
    student = torch.cat([s.old_logprobs for turns in own for s in turns])
    # a teacher 1 nat above the student on even tokens, 1 nat below on odd ones
    shift = torch.tensor([1.0 if j % 2 == 0 else -1.0 for j in range(student.numel())])
    parts = iter((student + shift).split([s.num_action_tokens for turns in own for s in turns]))
    taught = [[replace(s, teacher_logprobs=next(parts)) for s in turns] for turns in own]

    def after_one_step(batch, coef):
        torch.manual_seed(0)
        model = load_policy("tiny")
        learner = _learner(model, lr=1e-3, distill_coef=coef)
        (record,) = learner.step(batch)
        with torch.no_grad():
            new = torch.cat([lp for turns in batch for lp in
                             learner.model.forward([s.input_ids for s in turns], [(s.action_start, len(s.input_ids)) for s in turns])])
        return record, new

    record, moved = after_one_step(taught, 0.5)
    assert record.metrics["loss/distill_kl"] == pytest.approx(-float(shift.mean()), abs=1e-4)
    change = moved - student
    assert change[shift > 0].mean() > 0 > change[shift < 0].mean()
    still, unmoved = after_one_step(taught, 0.0)
    assert "loss/distill_kl" not in still.metrics and torch.allclose(unmoved, student, atol=1e-5)
    with pytest.raises(ValueError, match="teacher_logprobs"):
        _learner(load_policy("tiny"), distill_coef=0.5).step([[replace(s, teacher_logprobs=None) for s in turns] for turns in own])


@pytest.mark.parametrize("distill", ["topk", "full"])
def test_distribution_distillation_moves_the_policy_toward_the_teacher(policy, distill):
    """learner.distill=topk|full with zero credit: one step lowers the JSD between the
    policy and a teacher that puts 90% on another id than the sampled one at each token,
    and raises the policy's probability of that id; coefficient 0 moves nothing; and the
    teacher distribution is required."""
    from hp_agent.kernels import TeacherSupport

    trajectories = _rollouts(policy, tasks=2)
    scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    samples, _ = _credit(trajectories, scores)
    vocab = policy.model.get_output_embeddings().weight.shape[0]

    def teacher_of(sample):
        target = (torch.tensor(sample.input_ids[sample.action_start :]) + 1) % vocab
        if distill == "topk":
            return TeacherSupport(target[:, None], torch.full((len(target), 1), math.log(0.9)))
        rest = torch.full((len(target), vocab), math.log(0.1 / (vocab - 1)))
        return TeacherSupport(None, rest.scatter(1, target[:, None], math.log(0.9)))

    taught = [[replace(s, credit=torch.zeros_like(s.credit), teacher=teacher_of(s)) for s in turns] for turns in samples]
    flat = [s for turns in taught for s in turns]
    teacher = TeacherSupport.cat([s.teacher for s in flat])
    target = torch.cat([(torch.tensor(s.input_ids[s.action_start :]) + 1) % vocab for s in flat])

    def after_one_step(coef):
        torch.manual_seed(0)
        learner = _learner(load_policy("tiny"), lr=1e-3, distill_coef=coef, distill=distill)
        inputs = [s.input_ids for s in flat], [(s.action_start, len(s.input_ids)) for s in flat], None, teacher
        with torch.no_grad():
            _, before = learner.model.forward_with_teacher(*inputs)
            lp_before = _target_logprobs(learner, flat, target)
        (record,) = learner.step(taught)
        with torch.no_grad():
            _, after = learner.model.forward_with_teacher(*inputs)
            lp_after = _target_logprobs(learner, flat, target)
        return record, before, after, lp_after - lp_before

    record, before, after, gain = after_one_step(1.0)
    assert record.metrics["loss/distill_jsd"] == pytest.approx(float(before.mean()), rel=1e-3)
    assert float(after.mean()) < float(before.mean()) and float(gain.mean()) > 0
    still, before, after, gain = after_one_step(0.0)
    assert "loss/distill_jsd" not in still.metrics and torch.allclose(before, after, atol=1e-5)
    with pytest.raises(ValueError, match="teacher distribution"):
        _learner(load_policy("tiny"), distill_coef=0.5, distill=distill).step(samples)


def _target_logprobs(learner, samples, target):
    """log pi(target) at each action position of ``samples`` under the learner's weights."""
    learner.model.trained.eval()
    logits = [learner.model.trained(torch.tensor([s.input_ids])).logits[0, s.action_start - 1 : len(s.input_ids) - 1]
              for s in samples]
    return torch.log_softmax(torch.cat(logits).float(), -1).gather(-1, target[:, None]).squeeze(-1)


def test_distillation_makes_any_rule_score_hindsight():
    from hp_agent.config import load_config

    assert not load_config(None, ["algo.name=grpo"]).scores_hindsight
    assert load_config(None, ["algo.name=grpo", "learner.distill_coef=0.1"]).scores_hindsight
    assert load_config(None, ["algo.name=hp-rlvr"]).scores_hindsight
