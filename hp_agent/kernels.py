"""Log-probs and the normalized JSD over chunks: the tensor kernels that the hindsight
scorer, the learner and SFT share (pure functions, no credit rules).

Every kernel makes logits ``chunk_size`` tokens at a time from final hidden states, so a
[T, V] logit tensor never exists (V = 151,936 for Qwen3).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Literal, NamedTuple

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


def _logit_chunks(
    hidden: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor], chunk_size: int, allowed: Allowed | None
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(start, stop, logits)`` of ``chunk_size`` tokens at a time, restricted as decoding was."""
    for start in range(0, hidden.shape[0], chunk_size):
        stop = min(start + chunk_size, hidden.shape[0])
        yield start, stop, restrict_chunk(project(hidden[start:stop]), allowed, start)


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
    parts = [chosen_logprobs(logits, token_ids[start:stop])
             for start, stop, logits in _logit_chunks(hidden, project, chunk_size, allowed)]
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


class TeacherSupport(NamedTuple):
    """The hindsight-conditioned distribution at T action tokens, as the distillation term reads it.

    ids:      [T, k] the teacher's k likeliest token ids at each position (top-k), or None:
              the whole vocabulary in order (full).
    logprobs: [T, k] (or [T, V]) the teacher's log-probs of those ids.
    """

    ids: torch.Tensor | None
    logprobs: torch.Tensor

    def rows(self, start: int, stop: int) -> TeacherSupport:
        return TeacherSupport(None if self.ids is None else self.ids[start:stop], self.logprobs[start:stop])

    def to(self, device: torch.device | str) -> TeacherSupport:
        return TeacherSupport(None if self.ids is None else self.ids.to(device), self.logprobs.to(device))

    @staticmethod
    def cat(parts: list[TeacherSupport]) -> TeacherSupport:
        ids = None if parts[0].ids is None else torch.cat([p.ids for p in parts])
        return TeacherSupport(ids, torch.cat([p.logprobs for p in parts]))


def teacher_support(logits: torch.Tensor, topk: int | None) -> TeacherSupport:
    """The distribution of ``logits`` [n, V] kept for distillation: its ``topk`` likeliest
    ids and their log-probs, or (``topk`` None) every id's log-prob."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    if topk is None:
        return TeacherSupport(None, logprobs)
    top = logprobs.topk(min(topk, logprobs.shape[-1]), dim=-1)
    return TeacherSupport(top.indices, top.values)


LOGPROB_FLOOR = -80.0  # exp(-80) ~ 2e-35: a bin this unlikely adds nothing, and no -inf reaches a gradient


def _with_tail(logprobs: torch.Tensor) -> torch.Tensor:
    """[n, k] log-probs of k ids and a last bin: the mass of every other id, log(1 - sum)."""
    inside = torch.logsumexp(logprobs, dim=-1, keepdim=True).clamp(max=-1e-12)
    return torch.cat([logprobs, torch.log(-torch.expm1(inside))], dim=-1)


def support_jsd(student_logits: torch.Tensor, teacher: TeacherSupport) -> torch.Tensor:
    """Normalized JSD [n] between the student softmax(``student_logits`` [n, V]) and the
    teacher, on the teacher's support: its top-k ids and one bin for the rest (the
    student's mass outside them against the teacher's), or every id (full).

    >>> logits = torch.tensor([[0.0, 0.0, -float("inf")]])
    >>> support_jsd(logits, teacher_support(logits, None)), support_jsd(logits, teacher_support(logits, 1))
    (tensor([0.]), tensor([0.]))
    """
    student = torch.log_softmax(student_logits.float(), dim=-1)
    teacher_lp = teacher.logprobs
    if teacher.ids is not None:
        student, teacher_lp = _with_tail(student.gather(-1, teacher.ids)), _with_tail(teacher_lp)
    log_p, log_q = student.clamp(min=LOGPROB_FLOOR), teacher_lp.clamp(min=LOGPROB_FLOOR)
    log_m = torch.logaddexp(log_p, log_q) - LN2
    jsd = 0.5 * (log_p.exp() * (log_p - log_m)).sum(-1) + 0.5 * (log_q.exp() * (log_q - log_m)).sum(-1)
    return jsd / LN2


def chunked_logprobs_and_jsd(
    hidden: torch.Tensor,
    token_ids: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    teacher: TeacherSupport,
    chunk_size: int = 512,
    allowed: Allowed | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`chunked_logprobs` [T] and, from the same logits, :func:`support_jsd` [T] of each
    token's distribution against the ``teacher``'s (rows aligned with ``token_ids``)."""
    logprobs, divergences = [], []
    for start, stop, logits in _logit_chunks(hidden, project, chunk_size, allowed):
        logprobs.append(chosen_logprobs(logits, token_ids[start:stop]))
        divergences.append(support_jsd(logits, teacher.rows(start, stop)))
    if not logprobs:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty.clone()
    return torch.cat(logprobs), torch.cat(divergences)


class TokenViews(NamedTuple):
    """What the scorer reads of each action token under its two contexts, [T] each.

    weights:            normalized JSD between the causal and the hindsight distributions, in [0, 1].
    causal_logprobs:    log pi(y_j | causal history), the behaviour log-prob.
    hindsight_logprobs: log pi(y_j | hindsight context): with the causal one, the
                        sampled-token ratio that teacher-student rules (OPSD, HCAPO) read.
    teacher:            the hindsight distribution kept for distillation (top-k or full), or None.
    """

    weights: torch.Tensor
    causal_logprobs: torch.Tensor
    hindsight_logprobs: torch.Tensor
    teacher: TeacherSupport | None = None


def jsd_weights_from_hidden(
    causal_hidden: torch.Tensor,
    hindsight_hidden: torch.Tensor,
    token_ids: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    chunk_size: int = 512,
    chunk_elements: int = 1 << 23,
    compiled: bool = False,
    allowed: Allowed | None = None,
    teacher: Literal["none", "topk", "full"] = "none",
    teacher_topk: int = 20,
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
    ``teacher``: keep the hindsight distribution for distillation, its ``teacher_topk``
    likeliest ids (topk: [T, k]) or all of it (full: a [T, V] tensor, kept).

    Both log-probs come from the logits the JSD reads, so they cost no extra pass.
    """
    weights, logprobs, hindsight_logprobs, kept = [], [], [], []
    chunks = zip(_logit_chunks(causal_hidden, project, chunk_size, allowed),
                 _logit_chunks(hindsight_hidden, project, chunk_size, allowed))
    for (start, stop, p_logits), (_, _, q_logits) in chunks:
        weights.append(chunked_jsd_from_logits(p_logits, q_logits, chunk_elements, compiled))
        rows = max(1, chunk_elements // p_logits.shape[-1])
        logprobs.append(_rows_at_a_time(chosen_logprobs, (p_logits, token_ids[start:stop]), rows))
        hindsight_logprobs.append(_rows_at_a_time(chosen_logprobs, (q_logits, token_ids[start:stop]), rows))
        if teacher != "none":
            kept.append(teacher_support(q_logits, teacher_topk if teacher == "topk" else None))
        del p_logits, q_logits
    if not weights:
        empty = causal_hidden.new_zeros(0, dtype=torch.float32)
        return TokenViews(empty, empty.clone(), empty.clone())
    return TokenViews(torch.cat(weights), torch.cat(logprobs), torch.cat(hindsight_logprobs),
                      TeacherSupport.cat(kept) if kept else None)
