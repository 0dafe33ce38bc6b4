"""Log-probs and the normalized JSD over chunks: the tensor kernels that the hindsight
scorer, the learner and SFT share (pure functions, no credit rules).

Every kernel makes logits ``chunk_size`` tokens at a time from final hidden states, so a
[T, V] logit tensor never exists (V = 151,936 for Qwen3).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

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


class TokenViews(NamedTuple):
    """What the scorer reads of each action token under its two contexts, [T] each.

    weights:            normalized JSD between the causal and the hindsight distributions, in [0, 1].
    causal_logprobs:    log pi(y_j | causal history), the behaviour log-prob.
    hindsight_logprobs: log pi(y_j | hindsight context): with the causal one, the
                        sampled-token ratio that teacher-student rules (OPSD, HCAPO) read.
    """

    weights: torch.Tensor
    causal_logprobs: torch.Tensor
    hindsight_logprobs: torch.Tensor


def jsd_weights_from_hidden(
    causal_hidden: torch.Tensor,
    hindsight_hidden: torch.Tensor,
    token_ids: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    chunk_size: int = 512,
    chunk_elements: int = 1 << 23,
    compiled: bool = False,
    allowed: Allowed | None = None,
) -> TokenViews:
    """JSD weights and both views' log-probs of T tokens, from final hidden states.

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

    Both log-probs come from the logits the JSD reads, so they cost no extra pass.
    """
    weights, logprobs, hindsight_logprobs = [], [], []
    for start in range(0, causal_hidden.shape[0], chunk_size):
        stop = start + chunk_size
        p_logits = restrict_chunk(project(causal_hidden[start:stop]), allowed, start)
        q_logits = restrict_chunk(project(hindsight_hidden[start:stop]), allowed, start)
        weights.append(chunked_jsd_from_logits(p_logits, q_logits, chunk_elements, compiled))
        rows = max(1, chunk_elements // p_logits.shape[-1])
        logprobs.append(_rows_at_a_time(chosen_logprobs, (p_logits, token_ids[start:stop]), rows))
        hindsight_logprobs.append(_rows_at_a_time(chosen_logprobs, (q_logits, token_ids[start:stop]), rows))
        del p_logits, q_logits
    if not weights:
        empty = causal_hidden.new_zeros(0, dtype=torch.float32)
        return TokenViews(empty, empty.clone(), empty.clone())
    return TokenViews(torch.cat(weights), torch.cat(logprobs), torch.cat(hindsight_logprobs))
