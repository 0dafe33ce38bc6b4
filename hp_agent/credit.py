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
) -> torch.Tensor:
    """log pi(token_ids) [T] from hidden states [T, H], ``chunk_size`` tokens of logits at a time."""
    parts = [
        chosen_logprobs(project(hidden[start : start + chunk_size]), token_ids[start : start + chunk_size])
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

    Returns ``(weights [T] in [0, 1], causal_logprobs [T])``.
    """
    weights, logprobs = [], []
    for start in range(0, causal_hidden.shape[0], chunk_size):
        stop = start + chunk_size
        p_logits = project(causal_hidden[start:stop])
        q_logits = project(hindsight_hidden[start:stop])
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


def hp_rlvr_credit(
    weights: torch.Tensor,
    reward: float,
    baseline: float,
    token_penalties: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """HP-RLVR token credit c_j = w_j (R - b) (+ the penalty of the token's turn).

    ``weights``: [T] in [0, 1]; ``token_penalties``: [T], the per-turn shaping reward
    (e.g. -0.1 on an invalid action) broadcast to that turn's tokens. With w in [0, 1],
    |w (R - b)| <= |R - b| <= R_max - R_min whenever b lies in [R_min, R_max].

    >>> hp_rlvr_credit(torch.tensor([0.0, 0.5, 1.0]), reward=1.0, baseline=0.25)[0]
    tensor([0.0000, 0.3750, 0.7500])
    """
    centered = reward - baseline
    credit = weights * centered
    if token_penalties is not None:
        credit = credit + token_penalties
    metrics = {
        "credit/centered_reward": centered,
        "credit/weight_mean": float(weights.mean()) if weights.numel() else 0.0,
        "credit/abs_mean": float(credit.abs().mean()) if credit.numel() else 0.0,
    }
    return credit, metrics


def grpo_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO advantages A_i = (R_i - mean_g) / (std_g + eps), per group g of rollouts.

    ``rewards``, ``groups``: [N] (``groups[i]`` is the prompt group of trajectory i).
    std is the unbiased sample std (0 for a group of one); ``scale_by_std=False`` gives
    A_i = R_i - mean_g. A group whose rewards are all equal gets A = 0 exactly.

    >>> grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1]))[0]
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
    metrics = {
        "credit/degenerate_group_fraction": degenerate / max(len(unique_groups), 1),
        "credit/abs_mean": float(advantages.abs().mean()) if advantages.numel() else 0.0,
    }
    return advantages, metrics


@dataclass
class HistoricalBaseline:
    """Running reward baseline b per task, falling back to task type, then environment.

    ``value`` reads the finest level that has an estimate, else ``initial``. A level's
    estimate starts, when first updated, from what ``value`` gave for it (the coarser
    estimate or ``initial``) counted as ``prior_weight`` past rewards, and then moves
    as v <- v + max(rate, 1 / n) (R - v), n the count including the prior: a mean that
    shrinks toward the prior, then an exponential moving average. With a prior, a task
    that always fails keeps a small positive b, so its failures keep negative credit
    instead of dropping to an exact zero. The caller reads b for a trajectory before
    calling ``update`` with its reward, so a reward never centers itself.
    """

    rate: float = 0.1
    initial: float = 0.0
    prior_weight: float = 1.0
    estimates: dict[str, list[float]] = field(default_factory=dict)  # key -> [count, value]

    @staticmethod
    def keys(env: str, task_type: str, task_id: str) -> tuple[str, str, str]:
        return f"task:{env}/{task_id}", f"type:{env}/{task_type}", f"env:{env}"

    def _read(self, keys: tuple[str, ...]) -> float:
        for key in keys:
            if key in self.estimates:
                return self.estimates[key][1]
        return self.initial

    def value(self, env: str, task_type: str, task_id: str) -> float:
        return self._read(self.keys(env, task_type, task_id))

    def update(self, env: str, task_type: str, task_id: str, reward: float) -> None:
        keys = self.keys(env, task_type, task_id)
        starts = [self._read(keys[level:]) for level in range(len(keys))]  # before any change
        for key, start in zip(keys, starts):
            count, value = self.estimates.get(key, [self.prior_weight, start])
            count += 1
            value += max(self.rate, 1.0 / count) * (reward - value)
            self.estimates[key] = [count, value]

    def state_dict(self) -> dict:
        return {"rate": self.rate, "initial": self.initial, "prior_weight": self.prior_weight, "estimates": self.estimates}

    def load_state_dict(self, state: dict) -> None:
        self.rate, self.initial, self.prior_weight = state["rate"], state["initial"], state["prior_weight"]
        self.estimates = {key: list(v) for key, v in state["estimates"].items()}
