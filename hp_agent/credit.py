"""Token credit: the math of HP-RLVR and GRPO as pure tensor functions.

DESIGN.md steps 4-6 (HP-RLVR) and the GRPO advantage live here, each a function of
explicit arguments: no config objects, no logging, no I/O. Functions that produce a
training signal return ``(value, metrics)``.

Notation: T eligible tokens of one trajectory, V vocabulary size, R the verifier reward,
b the historical baseline, w_j the normalized JSD weight of token j.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hp_agent.constraint import Allowed, restrict_chunk

LN2 = math.log(2.0)


def jsd_from_logits(causal_logits: torch.Tensor, hindsight_logits: torch.Tensor) -> torch.Tensor:
    """Normalized Jensen-Shannon divergence between two softmax distributions.

    ``causal_logits``, ``hindsight_logits``: [N, V]. Returns [N] in [0, 1]:

        JSD(p, q) / ln 2,  JSD = 1/2 KL(p || m) + 1/2 KL(q || m),  m = (p + q) / 2

    with 0 log 0 = 0, so -inf logits (masked vocabulary) are allowed. Equals
    ``scipy.spatial.distance.jensenshannon(p, q, base=2) ** 2``.

    >>> jsd_from_logits(torch.tensor([[0.0, -float("inf")]]), torch.tensor([[-float("inf"), 0.0]]))
    tensor([1.])
    """
    log_p = torch.log_softmax(causal_logits.float(), dim=-1)
    log_q = torch.log_softmax(hindsight_logits.float(), dim=-1)
    log_m = torch.logaddexp(log_p, log_q) - LN2

    def kl_to_m(log_x: torch.Tensor) -> torch.Tensor:
        x = log_x.exp()
        # Where x = 0 the term is 0 log 0 = 0; masking avoids (-inf) - (-inf) = nan.
        return torch.where(x > 0, x * (log_x - log_m), torch.zeros_like(x)).sum(-1)

    jsd = 0.5 * kl_to_m(log_p) + 0.5 * kl_to_m(log_q)
    return (jsd / LN2).clamp(0.0, 1.0)


def chosen_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token]: ``logits`` [..., V], ``token_ids`` [...] -> [...]."""
    logits = logits.float()
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


@functools.cache
def compiled_jsd_kernel() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """:func:`jsd_from_logits` through ``torch.compile``: fused passes, no [n, V] temporaries.

    Pays off at a large vocabulary (bench/jsd_memory.py compares it with eager at
    V = 151,936), after a one-off compile of several seconds per process; at the tiny
    model's V the compile costs more than it saves, hence off by default.
    """
    return torch.compile(jsd_from_logits, dynamic=True)


def _rows_at_a_time(fn: Callable[..., torch.Tensor], tensors: tuple[torch.Tensor, ...], rows: int) -> torch.Tensor:
    """``fn`` applied to ``rows`` leading rows of every tensor at a time, results concatenated."""
    return torch.cat([fn(*(t[start : start + rows] for t in tensors)) for start in range(0, tensors[0].shape[0], rows)])


def chunked_jsd_from_logits(
    causal_logits: torch.Tensor,
    hindsight_logits: torch.Tensor,
    chunk_elements: int = 1 << 23,
    compiled: bool = False,
) -> torch.Tensor:
    """:func:`jsd_from_logits` of [N, V] logits, ``max(1, chunk_elements // V)`` rows at a time.

    The formula's temporaries (both views' log-probs, the mixture's, products) are
    [rows, V] each, about 7 x 4 x ``chunk_elements`` bytes (224 MB by default) whatever N,
    instead of 7 x 4 x N x V bytes (17 GB for N = 4,096 at Qwen3's V = 151,936).
    ``compiled`` runs each chunk through :func:`compiled_jsd_kernel`. Returns [N].
    """
    if causal_logits.shape[0] == 0:
        return causal_logits.new_zeros(0, dtype=torch.float32)
    kernel = compiled_jsd_kernel() if compiled else jsd_from_logits
    rows = max(1, chunk_elements // causal_logits.shape[-1])
    return _rows_at_a_time(kernel, (causal_logits, hindsight_logits), rows)


def chunked_logprobs(
    hidden: torch.Tensor,
    token_ids: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    chunk_size: int = 512,
    allowed: Allowed | None = None,
) -> torch.Tensor:
    """log pi(token_ids) [T] from hidden states [T, H], ``chunk_size`` tokens of logits at a time.

    ``allowed``: per token, the ids decoding was restricted to (None: any), so that pi is
    the model's distribution renormalized over them (:mod:`hp_agent.constraint`).
    """
    parts = [
        chosen_logprobs(restrict_chunk(project(hidden[start : start + chunk_size]), allowed, start),
                        token_ids[start : start + chunk_size])
        for start in range(0, hidden.shape[0], chunk_size)
    ]
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


def jsd_weights_from_hidden(
    causal_hidden: torch.Tensor,
    hindsight_hidden: torch.Tensor,
    token_ids: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    chunk_size: int = 512,
    chunk_elements: int = 1 << 23,
    compiled: bool = False,
    allowed: Allowed | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """JSD weights and causal log-probs of T tokens, from final hidden states.

    ``causal_hidden``, ``hindsight_hidden``: [T, H], the states that predict each token
    under the two contexts; ``token_ids``: [T]; ``project`` maps [n, H] to logits [n, V]
    (the LM head, with any temperature applied). Logits are made ``chunk_size`` tokens at
    a time (large enough for an efficient LM-head matmul), and the JSD and log-softmax of
    each chunk are taken ``chunk_elements // V`` rows at a time (see
    :func:`chunked_jsd_from_logits`). Peak extra memory is two [chunk_size, V] logit
    tensors plus the row chunk's temporaries: about 0.8 GB at chunk_size 512 and
    V = 151,936 in float32, never a [T, V] tensor.

    ``allowed``: per token, the ids decoding was restricted to (None: any); both views are
    then renormalized over the same set, so the JSD compares what could have been sampled.

    Returns ``(weights [T] in [0, 1], causal_logprobs [T])``.
    """
    weights, logprobs = [], []
    for start in range(0, causal_hidden.shape[0], chunk_size):
        stop = start + chunk_size
        p_logits = restrict_chunk(project(causal_hidden[start:stop]), allowed, start)
        q_logits = restrict_chunk(project(hindsight_hidden[start:stop]), allowed, start)
        weights.append(chunked_jsd_from_logits(p_logits, q_logits, chunk_elements, compiled))
        rows = max(1, chunk_elements // p_logits.shape[-1])
        logprobs.append(_rows_at_a_time(chosen_logprobs, (p_logits, token_ids[start:stop]), rows))
        del p_logits, q_logits
    if not weights:
        empty = causal_hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty.clone()
    return torch.cat(weights), torch.cat(logprobs)


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
    """

    rewards: torch.Tensor
    baselines: torch.Tensor
    groups: torch.Tensor
    turn_trajectory: torch.Tensor
    turn_shaping: torch.Tensor
    token_turn: torch.Tensor
    weights: torch.Tensor | None = None

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
    """

    weight_norm: str
    grpo_scale_by_std: bool
    grpo_eps: float


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
    >>> hp_rlvr_credit(batch, CreditOptions(weight_norm="none", grpo_scale_by_std=True, grpo_eps=1e-6))[0]
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


@dataclass
class HistoricalBaseline:
    """Running reward baseline b per task, falling back to task type, then environment.

    It starts unbiased, with no invented prior: a level's estimate is set by the rewards
    it observes. The first update of a level starts it from what the coarser levels hold
    (counted as ``prior_weight`` past rewards, 0 for none), or, when nothing is known
    yet, from that first reward alone; it then moves as v <- v + max(rate, 1 / n) (R - v),
    n the count: a running mean, then an exponential moving average. ``initial``, when the
    user gives one, is the value read before anything is observed.

    The caller reads b for a batch (:meth:`batch_values`) before calling ``update`` with
    its rewards, so a reward never centers itself.
    """

    rate: float = 0.1
    initial: float | None = None
    prior_weight: float = 1.0
    estimates: dict[str, list[float]] = field(default_factory=dict)  # key -> [count, value]

    @staticmethod
    def keys(env: str, task_type: str, task_id: str) -> tuple[str, str, str]:
        return f"task:{env}/{task_id}", f"type:{env}/{task_type}", f"env:{env}"

    def _read(self, keys: tuple[str, ...]) -> float | None:
        for key in keys:
            if key in self.estimates:
                return self.estimates[key][1]
        return self.initial

    def value(self, env: str, task_type: str, task_id: str) -> float | None:
        """b for one task, or None when nothing has been observed (and no ``initial``)."""
        return self._read(self.keys(env, task_type, task_id))

    def batch_values(self, tasks: list[tuple[str, str, str]], rewards: list[float]) -> list[float]:
        """b for each ``(env, task_type, task_id)`` of a batch, read before any update.

        A trajectory of an env with no estimate yet (the run's first step) gets the mean
        reward of the batch's other trajectories of that env: leave-one-out, so it does
        not depend on its own reward and stays unbiased; alone, it gets its own reward
        (no credit).
        """
        values = [self.value(*task) for task in tasks]
        for i, value in enumerate(values):
            if value is None:
                others = [r for j, r in enumerate(rewards) if j != i and tasks[j][0] == tasks[i][0]]
                values[i] = sum(others) / len(others) if others else rewards[i]
        return values  # type: ignore[return-value]

    def update(self, env: str, task_type: str, task_id: str, reward: float) -> None:
        keys = self.keys(env, task_type, task_id)
        starts = [self._read(keys[level + 1 :]) for level in range(len(keys))]  # before any change
        for key, start in zip(keys, starts):
            count, value = self.estimates.get(key, [self.prior_weight, start] if start is not None else [0.0, 0.0])
            count += 1
            value += max(self.rate, 1.0 / count) * (reward - value)
            self.estimates[key] = [count, value]

    def state_dict(self) -> dict:
        return {"rate": self.rate, "initial": self.initial, "prior_weight": self.prior_weight, "estimates": self.estimates}

    def load_state_dict(self, state: dict) -> None:
        self.rate, self.initial, self.prior_weight = state["rate"], state["initial"], state["prior_weight"]
        self.estimates = {key: list(v) for key, v in state["estimates"].items()}
