"""Token credit rules as pure tensor functions: HP-RLVR (DESIGN.md steps 5-6), GRPO and
REINFORCE, over one step's :class:`CreditBatch`. Each takes explicit arguments (no config
objects, no logging, no I/O) and returns ``(credit [M], metrics)``.

Notation: N trajectories, K turns, M eligible (action) tokens; R the verifier reward, b
the historical baseline (:mod:`hp_agent.credit.baseline`), w_j the normalized JSD weight
of token j (:mod:`hp_agent.kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

def normalize_weights(weights: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-trajectory weight normalization (a choice the paper leaves open).

    ``"none"``: w as is. ``"max"``: w / max(w), so the token where hindsight changes the
    policy most gets full credit. ``"mean"``: w / mean(w), clipped at 1 so the credit
    bound still holds. All-zero weights stay zero.
    """
    if mode == "none" or weights.numel() == 0:
        return weights
    if mode == "max":
        scale = weights.max()
    elif mode == "mean":
        scale = weights.mean()
    else:
        raise ValueError(f"unknown weight normalization {mode!r}; valid: none, max, mean")
    if scale <= 0:
        return weights
    return (weights / scale).clamp(max=1.0)


@dataclass(frozen=True)
class CreditBatch:
    """One step's trajectories as flat tensors: N trajectories, K turns, M action tokens.

    rewards:         [N] outcome reward R_i (the verifier's verdict).
    baselines:       [N] historical baseline b_i, read before this batch updated it.
    groups:          [N] prompt group of each trajectory (GRPO's G rollouts share one).
    turn_trajectory: [K] trajectory index of each turn.
    turn_shaping:    [K] per-turn shaping reward, negative for a cost (-0.1: invalid action).
    token_turn:      [M] turn index of each action (eligible) token.
    weights:         [M] normalized JSD weight w_j in [0, 1], or None without hindsight.
    causal_logprobs: [M] log pi_old(y_j | causal history), or None without hindsight.
    hindsight_logprobs: [M] log pi_old(y_j | hindsight context), or None without hindsight.
    turn_state:      [K] id of the state each turn acted in: equal ids within a prompt group
                     are the same state (GiGPO's anchors; :func:`~hp_agent.credit.assembly.turn_states`).
    """

    rewards: torch.Tensor
    baselines: torch.Tensor
    groups: torch.Tensor
    turn_trajectory: torch.Tensor
    turn_shaping: torch.Tensor
    token_turn: torch.Tensor
    weights: torch.Tensor | None = None
    causal_logprobs: torch.Tensor | None = None
    hindsight_logprobs: torch.Tensor | None = None
    turn_state: torch.Tensor | None = None

    @property
    def token_trajectory(self) -> torch.Tensor:
        """[M] trajectory index of each token."""
        return self.turn_trajectory[self.token_turn]

    @property
    def token_shaping(self) -> torch.Tensor:
        """[M] the shaping reward of each token's turn."""
        return self.turn_shaping[self.token_turn]

    @property
    def returns(self) -> torch.Tensor:
        """[N] R_i plus the trajectory's summed shaping rewards."""
        shaping = torch.zeros_like(self.rewards).index_add_(0, self.turn_trajectory, self.turn_shaping.to(self.rewards.dtype))
        return self.rewards + shaping


@dataclass(frozen=True)
class CreditOptions:
    """Knobs the built-in rules read (a user's rule may ignore them): the config keys of the
    same names, described and defaulted there (``TrainConfig.credit_options``).

    weight_norm:       ``hindsight.weight_norm``, HP-RLVR's normalization of w (:func:`normalize_weights`).
    grpo_scale_by_std: ``algo.grpo_scale_by_std``, GRPO divides the group-centered return by the group std.
    grpo_eps:          ``algo.grpo_eps``, GRPO's std guard.
    opsd_clip, opsd_discount, hcapo_ratio_clip, gigpo_step_weight, gigpo_discount: the
                       ``algo`` keys of :mod:`hp_agent.credit.related`'s rules.
    """

    weight_norm: str
    grpo_scale_by_std: bool
    grpo_eps: float
    opsd_clip: float
    opsd_discount: float
    hcapo_ratio_clip: float
    gigpo_step_weight: float
    gigpo_discount: float


def normalized_weights(batch: CreditBatch, mode: str) -> torch.Tensor:
    """``batch.weights`` normalized within each trajectory (:func:`normalize_weights`)."""
    if batch.weights is None:
        raise ValueError("this credit rule needs hindsight weights (register it with hindsight=True)")
    if mode == "none":
        return batch.weights
    out = batch.weights.clone()
    owner = batch.token_trajectory
    for i in range(batch.rewards.shape[0]):
        members = owner == i
        out[members] = normalize_weights(batch.weights[members], mode)
    return out


def hp_rlvr_credit(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    """HP-RLVR token credit c_j = w_j (R_i - b_i) + s_t, t the turn of token j (DESIGN.md 6).

    s_t is the turn's shaping reward (negative for a cost), so an invalid turn's tokens get
    credit lowered by its cost wherever w_j is. With w in [0, 1] and b within the reward
    range, |w (R - b)| <= R_max - R_min.

    >>> one = torch.tensor([0])
    >>> batch = CreditBatch(torch.tensor([1.0]), torch.tensor([0.25]), one, one, torch.tensor([0.0]),
    ...                     torch.tensor([0, 0, 0]), torch.tensor([0.0, 0.5, 1.0]))
    >>> hp_rlvr_credit(batch, CreditOptions("none", True, 1e-6, 2.0, 0.0, 2.0, 1.0, 0.95))[0]
    tensor([0.0000, 0.3750, 0.7500])
    """
    weights = normalized_weights(batch, options.weight_norm)
    centered = batch.rewards - batch.baselines
    credit = weights * centered[batch.token_trajectory] + batch.token_shaping
    metrics = {"credit/centered_reward": float(centered.mean()), "credit/weight_mean": float(weights.mean()) if weights.numel() else 0.0}
    return credit, metrics


def grpo_credit(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO: every token of trajectory i gets A_i, the group-normalized return (R_i + sum_t s_t).

    Shaping enters the return, so of two failed rollouts of one prompt the one with an
    invalid turn gets the lower advantage.
    """
    advantages, metrics = grpo_advantages(batch.returns, batch.groups, options.grpo_scale_by_std, options.grpo_eps)
    return advantages[batch.token_trajectory], metrics


def reinforce_credit(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with the historical baseline: c_j = (R_i - b_i) + s_t on every token, one
    rollout per prompt. HP-RLVR without the hindsight weights (w_j = 1), for ablations."""
    centered = batch.rewards - batch.baselines
    return centered[batch.token_trajectory] + batch.token_shaping, {"credit/centered_reward": float(centered.mean())}


def grpo_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, scale_by_std: bool, eps: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO advantages A_i = (R_i - mean_g) / (std_g + eps), per group g of rollouts.

    ``rewards``, ``groups``: [N] (``groups[i]`` is the prompt group of trajectory i).
    std is the unbiased sample std (0 for a group of one); ``scale_by_std=False`` gives
    A_i = R_i - mean_g. A group whose rewards are all equal gets A = 0 exactly.

    >>> grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1]), True, 1e-6)[0]
    tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    """
    rewards = rewards.float()
    advantages = torch.zeros_like(rewards)
    degenerate = 0
    unique_groups = torch.unique(groups)
    for g in unique_groups:
        members = groups == g
        group_rewards = rewards[members]
        centered = group_rewards - group_rewards.mean()
        if torch.all(group_rewards == group_rewards[0]):
            degenerate += 1
            continue  # all equal: exactly zero, not eps-scaled rounding noise
        if scale_by_std:
            std = group_rewards.std(unbiased=True) if group_rewards.numel() > 1 else rewards.new_tensor(0.0)
            centered = centered / (std + eps)
        advantages[members] = centered
    return advantages, {"credit/degenerate_group_fraction": degenerate / max(len(unique_groups), 1)}


def zero_turn_credit(credit: torch.Tensor, token_turn: torch.Tensor, turn_masked: torch.Tensor) -> torch.Tensor:
    """``credit`` with every token of a masked turn set to exactly 0, the rest unchanged.

    ``credit``, ``token_turn``: [M]; ``turn_masked``: [K] bool, K turns. Whatever the rule
    (HP-RLVR, GRPO), a zero-credit token adds nothing to the clipped loss or its gradient:
    rho c = clip(rho) c = 0 (``rollout.truncated_turn=mask``, for turns cut before their
    end-of-turn token).

    >>> zero_turn_credit(torch.tensor([0.5, 0.5, -1.0]), torch.tensor([0, 1, 1]), torch.tensor([False, True]))
    tensor([0.5000, 0.0000, 0.0000])
    """
    return credit.masked_fill(turn_masked[token_turn], 0.0)


def credit_breakdown(
    credit: torch.Tensor, token_turn: torch.Tensor, turn_invalid: torch.Tensor, format_mask: torch.Tensor
) -> dict[str, float]:
    """Mean token credit by kind, so that a sign or scale error shows in the metrics.

    ``credit``, ``token_turn``, ``format_mask``: [M] (``format_mask`` is True on
    answer-format tokens such as ``<action>`` tags and the end-of-turn token);
    ``turn_invalid``: [K]. A kind with no tokens this step is left out.
    """
    kinds = {
        "credit/invalid_turns_mean": turn_invalid[token_turn],
        "credit/valid_turns_mean": ~turn_invalid[token_turn],
        "credit/format_tokens_mean": format_mask,
        "credit/content_tokens_mean": ~format_mask,
    }
    metrics = {key: float(credit[mask].mean()) for key, mask in kinds.items() if mask.any()}
    metrics["credit/mean"] = float(credit.mean()) if credit.numel() else 0.0
    metrics["credit/abs_mean"] = float(credit.abs().mean()) if credit.numel() else 0.0
    return metrics
