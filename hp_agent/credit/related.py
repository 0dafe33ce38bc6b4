"""Credit rules of related methods, beside HP-RLVR and GRPO on the same :class:`CreditBatch`:
OPSD, a hindsight-ratio GRPO (HCAPO), GiGPO and SPO. docs/algorithm.md gives each paper's
formula and what this project does differently; each is a pure function of the batch.

Every rule adds the turn's shaping reward s_t to its tokens as HP-RLVR does, or puts it
into the return where the method has one (GRPO's and GiGPO's), so that all of them see
the same rewards. ``rho_j = pi_old(y_j | hindsight) / pi_old(y_j | causal)`` is the
sampled token's ratio between the two views of the scorer.
"""

from __future__ import annotations

import torch

from hp_agent.credit.rules import CreditBatch, CreditOptions, grpo_advantages


def _hindsight_log_ratio(batch: CreditBatch) -> torch.Tensor:
    """[M] log rho_j = log pi(y_j | hindsight) - log pi(y_j | causal)."""
    if batch.hindsight_logprobs is None or batch.causal_logprobs is None:
        raise ValueError("this credit rule needs both views' log-probs (register it with hindsight=True)")
    return batch.hindsight_logprobs - batch.causal_logprobs


def discounted_within(values: torch.Tensor, owner: torch.Tensor, discount: float) -> torch.Tensor:
    """``out[j] = sum_{k >= j, owner[k] = owner[j]} discount^(k - j) values[k]``: a reverse
    discounted sum within each owner's run of consecutive entries; ``discount = 0``: ``values``.

    >>> discounted_within(torch.tensor([1.0, 1.0, 1.0, 2.0]), torch.tensor([0, 0, 0, 1]), 0.5)
    tensor([1.7500, 1.5000, 1.0000, 2.0000])
    """
    if discount == 0.0:
        return values.clone()
    out = values.clone()
    for k in range(values.shape[0] - 2, -1, -1):
        if owner[k] == owner[k + 1]:
            out[k] = values[k] + discount * out[k + 1]
    return out


def opsd_credit(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    """OPSD: the privileged view is the teacher; each token's credit is the teacher's
    log-prob minus the student's, clipped to +-``opsd_clip``, discounted within the
    trajectory by ``opsd_discount`` (0: each token its own), plus s_t. No reward term: the
    outcome reaches the credit only through the hindsight block's feedback.

    >>> one = torch.tensor([0])
    >>> batch = CreditBatch(torch.tensor([1.0]), torch.tensor([0.0]), one, one, torch.tensor([0.0]),
    ...                     torch.tensor([0, 0]), causal_logprobs=torch.tensor([-2.0, -1.0]),
    ...                     hindsight_logprobs=torch.tensor([-0.5, -9.0]))
    >>> opsd_credit(batch, CreditOptions("none", True, 1e-6, 2.0, 0.0, 2.0, 1.0, 0.95))[0]
    tensor([ 1.5000, -2.0000])
    """
    delta = _hindsight_log_ratio(batch).clamp(-options.opsd_clip, options.opsd_clip)
    credit = discounted_within(delta, batch.token_trajectory, options.opsd_discount) + batch.token_shaping
    return credit, {"credit/hindsight_log_ratio_mean": float(delta.mean()) if delta.numel() else 0.0}


def hcapo_credit(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    """A hindsight-ratio GRPO: GRPO's advantage A_i times the token's ratio rho_j, clipped
    to [1/c, c] (c = ``hcapo_ratio_clip``). Of a won trajectory, the tokens the outcome makes
    likelier get more credit; of a lost one, more blame. The multiplicative form.

    >>> groups = torch.tensor([0, 0])
    >>> batch = CreditBatch(torch.tensor([1.0, 0.0]), torch.zeros(2), groups, torch.tensor([0, 1]), torch.zeros(2),
    ...                     torch.tensor([0, 1]), causal_logprobs=torch.tensor([-1.0, -1.0]),
    ...                     hindsight_logprobs=torch.tensor([-1.0 + 0.5, -1.0 + 5.0]))
    >>> hcapo_credit(batch, CreditOptions("none", False, 1e-6, 2.0, 0.0, 2.0, 1.0, 0.95))[0]
    tensor([ 0.8244, -1.0000])
    """
    advantages, metrics = grpo_advantages(batch.returns, batch.groups, options.grpo_scale_by_std, options.grpo_eps)
    ratio = _hindsight_log_ratio(batch).exp().clamp(1.0 / options.hcapo_ratio_clip, options.hcapo_ratio_clip)
    metrics["credit/hindsight_ratio_mean"] = float(ratio.mean()) if ratio.numel() else 0.0
    return advantages[batch.token_trajectory] * ratio, metrics


def turn_returns(batch: CreditBatch, discount: float) -> torch.Tensor:
    """[K] discounted return from each turn on: its own and later turns' shaping, and the
    outcome R_i at the trajectory's last turn, discounted by ``discount`` a turn."""
    last = torch.ones_like(batch.turn_trajectory, dtype=torch.bool)
    last[:-1] = batch.turn_trajectory[1:] != batch.turn_trajectory[:-1]
    step_rewards = batch.turn_shaping.float() + torch.where(last, batch.rewards[batch.turn_trajectory].float(), 0.0)
    return discounted_within(step_rewards, batch.turn_trajectory, discount)


def gigpo_credit(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    """GiGPO: GRPO's episode advantage plus ``gigpo_step_weight`` times a step advantage:
    turns of one prompt group that start from the same state (``batch.turn_state``, an
    anchor) are a step group, and each turn's discounted return (``gigpo_discount``) is
    normalized within it as GRPO normalizes returns. A state no other turn of the group
    shares gets no step advantage.

    >>> groups = torch.tensor([0, 0])
    >>> batch = CreditBatch(torch.tensor([1.0, 0.0]), torch.zeros(2), groups, torch.tensor([0, 0, 1, 1]),
    ...                     torch.zeros(4), torch.tensor([0, 1, 2, 3]), turn_state=torch.tensor([0, 1, 0, 2]))
    >>> gigpo_credit(batch, CreditOptions("none", False, 1e-6, 2.0, 0.0, 2.0, 1.0, 0.5))[0]
    tensor([ 0.7500,  0.5000, -0.7500, -0.5000])
    """
    if batch.turn_state is None:
        raise ValueError("gigpo needs each turn's state (CreditBatch.turn_state)")
    episode, metrics = grpo_advantages(batch.returns, batch.groups, options.grpo_scale_by_std, options.grpo_eps)
    # A step group: same prompt group and same state; the state ids are unique within a prompt group.
    anchors = batch.groups[batch.turn_trajectory] * (int(batch.turn_state.max()) + 1) + batch.turn_state
    step, step_metrics = grpo_advantages(turn_returns(batch, options.gigpo_discount), anchors, options.grpo_scale_by_std,
                                         options.grpo_eps)
    _, which, counts = torch.unique(anchors, return_inverse=True, return_counts=True)
    shared = counts[which] > 1
    metrics["credit/anchor_turn_fraction"] = float(shared.float().mean()) if shared.numel() else 0.0
    metrics["credit/degenerate_anchor_fraction"] = step_metrics["credit/degenerate_group_fraction"]
    credit = episode[batch.token_trajectory] + options.gigpo_step_weight * step[batch.token_turn]
    return credit, metrics


def spo_credit(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    """SPO: one rollout per prompt, R_i minus the per-task tracker's value (``batch.baselines``,
    the historical baseline with ``baseline.decay``: a discounted Beta tracker), normalized
    by the batch's std of those differences (no mean subtraction), on every token, plus s_t.

    >>> one = torch.tensor([0, 1])
    >>> batch = CreditBatch(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), one, one, torch.zeros(2), one)
    >>> spo_credit(batch, CreditOptions("none", True, 1e-6, 2.0, 0.0, 2.0, 1.0, 0.95))[0]
    tensor([ 0.7071, -0.7071])
    """
    centered = batch.rewards - batch.baselines
    std = centered.std(unbiased=True) if centered.numel() > 1 else centered.new_tensor(0.0)
    scaled = centered / (std + options.grpo_eps) if std > 0 else centered
    return scaled[batch.token_trajectory] + batch.token_shaping, {"credit/centered_reward": float(centered.mean())}
