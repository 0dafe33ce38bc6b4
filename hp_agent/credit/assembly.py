"""Credit assembly (DESIGN.md steps 5-6 around the rule): one step's usable trajectories
and their scores become a :class:`~hp_agent.credit.rules.CreditBatch`, read against the
historical baseline before the batch updates it; the registered rule gives each action
token its credit; the result is the learner's :class:`TrainingSample` per turn, with the
credit's breakdown by kind in the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hp_agent.credit.baseline import HistoricalBaseline
from hp_agent.credit.registry import CreditRule
from hp_agent.credit.rules import CreditBatch, CreditOptions, credit_breakdown, zero_turn_credit
from hp_agent.distributed import SINGLE, Ranks, all_gather
from hp_agent.trajectory import Trajectory, format_token_mask, usable_indices

if TYPE_CHECKING:
    from hp_agent.hindsight import TrajectoryScores
    from hp_agent.kernels import TeacherSupport
    from hp_agent.policies import Policy


@dataclass
class TrainingSample:
    """One sequence to learn from: a turn's prompt and action, credit on the action.

    ``input_ids = prompt_ids + action_ids``; ``old_logprobs`` and ``credit`` are
    [len(action_ids)], aligned with the action (the eligible) tokens. ``old_logprobs``
    None: the learner's own log-probs stand for them, detached (the ratio is exactly 1),
    which is right only in an optimizer step taken on the weights that sampled.
    ``allowed``: the turn's restricted-decoding sets per action token (``Turn.allowed``).
    ``teacher_logprobs``: the action tokens' log-probs under the hindsight context, where
    the batch was scored with it (the distillation term's teacher; None: not scored).
    ``teacher``: the hindsight distribution at each action token, top-k or full, where
    the distillation term reads it (``learner.distill=topk|full``; else None).
    """

    input_ids: list[int]
    action_start: int
    old_logprobs: torch.Tensor | None
    credit: torch.Tensor
    allowed: list[list[int] | None] | None = None
    teacher_logprobs: torch.Tensor | None = None
    teacher: TeacherSupport | None = None

    @property
    def num_action_tokens(self) -> int:
        return len(self.input_ids) - self.action_start



def turn_states(trajectories: list[Trajectory]) -> list[int]:
    """Per turn, in order, an id of the state it acted in: the observation its action
    answered (the previous turn's; the first turn's is the task's start, which a prompt
    group's rollouts share). Equal text, equal id: as in GiGPO, two states are the same
    when the env shows the same text, so a "Nothing happens." after different actions is
    one state (a text env's observation is all the policy sees of its state)."""
    ids: dict[str, int] = {}
    return [ids.setdefault(turns[t - 1].observation if t else "", len(ids))
            for turns in (traj.turns for traj in trajectories) for t in range(len(turns))]


def credit_batch(
    trajectories: list[Trajectory], scores: list[TrajectoryScores], baselines: list[float], with_hindsight: bool
) -> CreditBatch:
    """The flat tensors a credit rule reads; ``baselines[i]``: trajectory i's b, read before
    any update. ``with_hindsight``: the scores hold hindsight weights and both views' log-probs."""
    turns = [(i, turn) for i, traj in enumerate(trajectories) for turn in traj.turns]
    token_turn = torch.cat([torch.full((len(turn.action_ids),), k, dtype=torch.long) for k, (_, turn) in enumerate(turns)])

    def flat(field: str) -> torch.Tensor | None:
        return torch.cat([part for score in scores for part in getattr(score, field)]) if with_hindsight else None

    return CreditBatch(
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        baselines=torch.tensor(baselines, dtype=torch.float32),
        groups=torch.tensor([t.group for t in trajectories], dtype=torch.long),
        turn_trajectory=torch.tensor([i for i, _ in turns], dtype=torch.long),
        turn_shaping=torch.tensor([turn.shaping for _, turn in turns], dtype=torch.float32),
        token_turn=token_turn,
        weights=flat("weights"),
        causal_logprobs=flat("causal_logprobs"),
        hindsight_logprobs=flat("hindsight_logprobs"),
        turn_state=torch.tensor(turn_states(trajectories), dtype=torch.long),
    )


def assign_credit(
    trajectories: list[Trajectory],
    scores: list[TrajectoryScores],
    rule: CreditRule,
    options: CreditOptions,
    baseline: HistoricalBaseline,
    format_masks: list[list[list[bool]]] | None = None,
    ranks: Ranks = SINGLE,
    mask_truncated: bool = False,
) -> tuple[list[list[TrainingSample]], dict[str, float]]:
    """Token credit for every turn of every usable trajectory (DESIGN.md steps 5-6), then
    the baseline update. Returns the learner's samples, one list of turns per trajectory.
    ``mask_truncated`` (``rollout.truncated_turn=mask``): a truncated turn's tokens get zero credit.

    ``format_masks[i][t]`` marks answer-format tokens of turn t of trajectory i (for the
    credit breakdown; all content when absent). With several ``ranks``, the baseline is
    read for and updated with every rank's trajectories in rank order, so that its state,
    and the credit, do not depend on how the batch was split.
    """
    usable = usable_indices(trajectories)
    kept = [trajectories[k] for k in usable]
    outcomes = all_gather([(t.env, t.task_type, t.task_id, t.reward) for t in kept], ranks)
    everyone = [outcome for part in outcomes for outcome in part]
    offset = sum(len(part) for part in outcomes[: ranks.rank])
    baselines = baseline.batch_values([o[:3] for o in everyone], [o[3] for o in everyone])[offset : offset + len(kept)]
    for env, task_type, task_id, reward in everyone:
        baseline.update(env, task_type, task_id, reward)
    if not kept:
        return [], {}
    batch = credit_batch(kept, [scores[k] for k in usable], baselines, rule.hindsight)
    credit, metrics = rule.fn(batch, options)
    turns = [turn for traj in kept for turn in traj.turns]
    if mask_truncated:
        credit = zero_turn_credit(credit, batch.token_turn, torch.tensor([turn.truncated for turn in turns], dtype=torch.bool))
    if format_masks is None:
        format_masks = [[[False] * len(turn.action_ids) for turn in t.turns] for t in trajectories]
    format_mask = torch.tensor([bit for k in usable for turn_mask in format_masks[k] for bit in turn_mask], dtype=torch.bool)
    invalid = torch.tensor([turn.invalid for turn in turns], dtype=torch.bool)
    metrics.update(credit_breakdown(credit, batch.token_turn, invalid, format_mask))
    metrics["credit/baseline_mean"] = float(batch.baselines.mean())
    turn_credit = iter(credit.split([len(turn.action_ids) for turn in turns]))
    samples = [
        [
            TrainingSample(turn.prompt_ids + turn.action_ids, len(turn.prompt_ids), old, next(turn_credit), turn.allowed,
                           teacher_logprobs, teacher)
            for turn, old, teacher_logprobs, teacher in zip(
                trajectories[k].turns, scores[k].causal_logprobs,
                scores[k].hindsight_logprobs or [None] * len(trajectories[k].turns),
                scores[k].teacher or [None] * len(trajectories[k].turns))
        ]
        for k in usable
    ]
    return samples, metrics


def answer_format_masks(policy: Policy, trajectories: list[Trajectory], answer_format: str | None) -> list[list[list[bool]]]:
    """Per trajectory and turn: True on the action's answer-format tokens (see ``TextEnv.answer_format``)."""
    special = policy.tokenizer.all_special_tokens
    return [[format_token_mask(policy.decode_tokens(turn.action_ids), answer_format, special) for turn in t.turns] for t in trajectories]
