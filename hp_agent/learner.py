"""The learner: token-level clipped policy gradient (DESIGN.md step 7).

    L = -(1 / N) sum_j min(rho_j c_j, clip(rho_j, 1 - eps_low, 1 + eps_high) c_j)
    rho_j = pi_theta(y_j) / pi_old(y_j)

and, for a token with negative credit, the dual clip: its term is never below C c_j
(``algo.clip_ratio_c`` C). Without it a token whose probability rose after
an earlier mini-batch (rho_j >> 1) but whose credit is negative takes the unclipped
branch, and its gradient grows with rho_j: measured on the box-and-key game, one such
mini-batch gave a gradient norm of 8.8 (against 0.02-0.5 in the other steps) and
turned the policy to empty, invalid actions within a step.

j runs over the action (the eligible) tokens, N their number in the mini-batch, c_j the
token credit (HP-RLVR) or the trajectory's advantage (GRPO). A token that must not learn
gets c_j = 0, which zeroes its term and gradient at any ratio (``credit.zero_turn_credit``),
so no separate eligibility mask is needed. Optimizer mini-batches are
counted in prompts, as verl counts PPO mini-batches: ``mini_batch_prompts`` prompts (each
with its G rollouts, always together, even when one was dropped) per optimizer step, so
HP-RLVR and GRPO take the same number of optimizer steps at equal prompts. Inside an
optimizer step the rollout slots are cut into *gradient records* of ``record_batch_size``
slots (8: one GRPO group); a record's norm is the norm of that batch's own contribution
to the step's gradient, so a GRPO group whose rewards all tie gives an exactly zero
record and GRPO logs about G times the records of HP-RLVR (paper Table 5 counts "all
logged gradient records, rather than distinct optimizer steps"). Micro-batches accumulate
gradients with the mini-batch's N as the normalizer, so micro-batching does not change
the update, nor does running a micro-batch's shared prompts once (``learner.packed``).
The total gradient norm of every optimizer step is clipped and recorded; a step whose
loss or gradient is not finite is skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hp_agent.batching import token_budget_batches
from hp_agent.constraint import joined_allowed
from hp_agent.credit.assembly import TrainingSample
from hp_agent.distributed import SINGLE, Ranks, all_gather, all_reduce_sum
from hp_agent.kernels import TeacherSupport
from hp_agent.packing import TRAINING, packed_batches
from hp_agent.parallel import Parallel, TrainModel
from hp_agent.policies import Policy

if TYPE_CHECKING:
    from hp_agent.config import TrainConfig


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    credit: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
    clip_ratio_c: float | None,
    num_eligible: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped token-level policy-gradient loss over action tokens. All tensors share one shape, e.g. [M].

    ``clip_ratio_c``: the dual clip's bound on a negative-credit token's ratio (None: off).
    ``num_eligible`` is the normalizer N (None: the tokens in these tensors; the learner
    passes the mini-batch's, so that micro-batches add up to its loss).

    >>> clipped_policy_loss(torch.zeros(2), torch.zeros(2), torch.tensor([1.0, -1.0]), 0.2, 0.2, 3.0)[0]
    tensor(-0.)
    """
    n = float(num_eligible if num_eligible is not None else logprobs.numel())
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * credit
    clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * credit
    per_token = torch.minimum(unclipped, clipped)
    if clip_ratio_c is not None:
        per_token = torch.where(credit < 0, torch.maximum(per_token, clip_ratio_c * credit), per_token)
    loss = -per_token.sum() / max(n, 1.0)
    with torch.no_grad():
        clipped_frac = (unclipped != clipped).sum().item() / max(ratio.numel(), 1)
        metrics = {"loss/clip_fraction": clipped_frac,
                   "loss/ratio_mean": ratio.mean().item() if ratio.numel() else 1.0,
                   "loss/ratio_max": ratio.max().item() if ratio.numel() else 1.0}
    return loss, metrics


def sampled_distill_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, num_eligible: int | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The sampled-token estimator of KL(pi_theta || pi_teacher), the teacher held fixed:
    sum_j rho_j sg(log pi_theta(y_j) - log pi_teacher(y_j)) / N, rho_j = pi_theta / pi_old
    (the tokens were sampled from pi_old). Its gradient is the reverse KL's: a token the
    policy holds likelier than the teacher is pushed down, one it holds less likely, up.
    All tensors [M]; ``num_eligible`` the normalizer N (None: M).

    >>> lp = torch.log(torch.tensor([0.5, 0.5])).requires_grad_()
    >>> loss, _ = sampled_distill_loss(lp, lp.detach(), torch.log(torch.tensor([0.25, 1.0])))
    >>> loss.backward(); lp.grad
    tensor([ 0.3466, -0.3466])
    """
    n = float(num_eligible if num_eligible is not None else logprobs.numel())
    excess = (logprobs - teacher_logprobs).detach()
    ratio = torch.exp(logprobs - old_logprobs)
    loss = (ratio * excess).sum() / max(n, 1.0)
    return loss, {"loss/distill_kl": excess.mean().item() if excess.numel() else 0.0}


def add_metrics(totals: dict[str, float], metrics: dict[str, float], weight: float) -> None:
    """Fold one part's metrics into ``totals``: a weighted sum, except the ``*_max`` ones."""
    for key, value in metrics.items():
        if key.endswith("_max"):
            totals[key] = max(totals.get(key, value), value)
        else:
            totals[key] = totals.get(key, 0.0) + weight * value


@dataclass
class StepRecord:
    """What one optimizer step did. ``grad_norm``: the step's total gradient norm before
    clipping; ``record_norms``: each gradient record's own contribution, in slot order."""

    loss: float
    grad_norm: float
    skipped_nonfinite: bool
    metrics: dict[str, float]
    record_norms: list[float]


class Learner:
    """AdamW on the policy's weights with the clipped token-level objective. Every argument
    but ``ranks`` is a config key (:meth:`from_config`), described and defaulted there."""

    def __init__(
        self,
        policy: Policy,
        lr: float,
        clip_eps_low: float,
        clip_eps_high: float,
        temperature: float,
        max_grad_norm: float,
        micro_batch_tokens: int,
        mini_batch_prompts: int,
        group_size: int,
        record_batch_size: int,
        weight_decay: float,
        betas: tuple[float, float],
        clip_ratio_c: float | None,
        parallel: Parallel,
        mixed_precision: bool,
        activation_checkpointing: bool,
        packed: bool,
        logit_chunk_tokens: int = 512,
        distill_coef: float = 0.0,
        distill: str = "sampled",
        ranks: Ranks = SINGLE,
    ):
        self.policy = policy
        self.ranks = ranks
        self.packed = packed
        self.model = TrainModel(policy.model, temperature, ranks, parallel, mixed_precision, activation_checkpointing,
                                packed, pad_id=policy.tokenizer.pad_token_id or 0, weights_changed=policy.weights_changed,
                                logit_chunk_tokens=logit_chunk_tokens)
        self.optimizer = torch.optim.AdamW(self.model.parameters, lr=lr, weight_decay=weight_decay, betas=betas)
        self.clip_eps_low, self.clip_eps_high, self.clip_ratio_c = clip_eps_low, clip_eps_high, clip_ratio_c
        self.max_grad_norm = max_grad_norm
        self.distill_coef, self.distill = distill_coef, distill
        self.micro_batch_tokens = micro_batch_tokens
        self.mini_batch_prompts, self.group_size, self.record_batch_size = mini_batch_prompts, group_size, record_batch_size

    @classmethod
    def from_config(cls, policy: Policy, config: TrainConfig, ranks: Ranks = SINGLE) -> Learner:
        """The learner a training run's ``learner`` and ``algo`` sections describe."""
        section = config.learner
        return cls(policy, lr=section.lr, clip_eps_low=config.algo.clip_eps_low, clip_eps_high=config.algo.clip_eps_high,
                   clip_ratio_c=config.algo.clip_ratio_c, temperature=config.rollout.temperature,
                   max_grad_norm=section.max_grad_norm, micro_batch_tokens=section.micro_batch_tokens,
                   mini_batch_prompts=section.mini_batch_prompts, group_size=config.algo.rollouts_per_prompt,
                   record_batch_size=section.record_batch_size, weight_decay=section.weight_decay, betas=section.betas,
                   ranks=ranks, parallel=section.parallel, mixed_precision=section.mixed_precision,
                   activation_checkpointing=section.activation_checkpointing, packed=section.packed,
                   logit_chunk_tokens=section.logit_chunk_tokens, distill_coef=section.distill_coef,
                   distill=section.distill)

    def save(self, folder: Path) -> None:
        """Write the optimizer's state (and a separate training copy's) into a checkpoint folder."""
        self.model.save(folder, self.optimizer)

    def load(self, folder: Path) -> None:
        """Restore what :meth:`save` wrote into ``folder``."""
        self.model.load(folder, self.optimizer)

    def optimizer_steps(self, num_prompts: int) -> int:
        """Optimizer steps a rollout batch of ``num_prompts`` prompts takes."""
        return math.ceil(num_prompts / self.mini_batch_prompts)

    def needs_behaviour_logprobs(self, num_prompts: int) -> bool:
        """Whether a rollout batch of ``num_prompts`` prompts needs the behaviour-policy
        replay (``TrainingSample.old_logprobs``): yes once it takes more than one optimizer
        step, since every step after the first runs on weights that did not sample, and
        the learner's own log-probs would then give a ratio of 1 against stale weights.
        :meth:`step` refuses such a batch without them."""
        return self.optimizer_steps(num_prompts) > 1

    def step(self, trajectories: list[list[TrainingSample]], slots: list[int] | None = None) -> list[StepRecord]:
        """Learn from one rollout batch (each trajectory's turns as samples), then give the
        policy's model the new weights.

        ``slots[i]``: trajectory i's place in the global rollout order (rank 0's episodes
        first, G consecutive slots a prompt), counted with the trajectories that were
        dropped, so that a drop never moves a group into another mini-batch or record.
        Default: this rank's trajectories are all there, after the lower ranks'. A rank
        learns from its part of each mini-batch, possibly none, and the step is the one a
        single process would take on the whole batch."""
        if slots is None:
            counts = all_gather(len(trajectories), self.ranks)
            slots = list(range(sum(counts[: self.ranks.rank]), sum(counts[: self.ranks.rank + 1])))
        slots_per_step = self.mini_batch_prompts * self.group_size
        parts: dict[tuple[int, int], list[TrainingSample]] = {}  # (optimizer step, record) -> samples
        for turns, slot in zip(trajectories, slots, strict=True):
            key = (slot // slots_per_step, slot % slots_per_step // self.record_batch_size)
            parts.setdefault(key, []).extend(s for s in turns if s.num_action_tokens > 0)
        micro = {key: self._micro_batches(samples) for key, samples in parts.items()}
        unreplayed = any(s.old_logprobs is None for samples in parts.values() for s in samples)
        shapes = all_gather(({key: (sum(s.num_action_tokens for s in samples), len(micro[key]))
                              for key, samples in parts.items()}, unreplayed), self.ranks)
        plan: dict[int, dict[int, tuple[int, int]]] = {}  # step -> record -> (eligible tokens, passes), over ranks
        for shape, _ in shapes:
            for (step, record), (tokens, passes) in shape.items():
                total, most = plan.setdefault(step, {}).get(record, (0, 0))
                plan[step][record] = (total + tokens, max(most, passes))
        # Checked on what every rank gathered, so that all ranks refuse together rather than some waiting.
        if any(flag for _, flag in shapes) and max(plan, default=0) > 0:
            raise ValueError(
                f"a rollout batch spanning {max(plan) + 1} optimizer steps (learner.mini_batch_prompts="
                f"{self.mini_batch_prompts} prompts each, trainer.prompts_per_step prompts in all) has samples without "
                "old_logprobs: every step after the first would take a ratio of 1 on stale weights. Score the batch "
                "for its behaviour log-probs (Learner.needs_behaviour_logprobs says when) or raise "
                "learner.mini_batch_prompts to trainer.prompts_per_step"
            )
        records = []
        for step in sorted(plan):
            record_plan = {record: passes for record, (tokens, passes) in sorted(plan[step].items()) if tokens}
            num_eligible = sum(tokens for tokens, _ in plan[step].values())
            if num_eligible:
                records.append(self._optimizer_step({r: micro.get((step, r), []) for r in record_plan}, record_plan,
                                                    num_eligible))
        self.model.publish()
        return records

    def _micro_batches(self, samples: list[TrainingSample]) -> list[list[TrainingSample]]:
        """Forward/backward passes of ``micro_batch_tokens`` tokens each. Packed, a prefix-tree
        row's sequences (a GRPO group's, which share their prompt) share a pass, or the
        prompt would run once per pass; the budget then counts the rows' nodes and padding."""
        sequences = [s.input_ids for s in samples]
        if self.packed:
            spans = [(s.action_start, len(s.input_ids)) for s in samples]
            batches = packed_batches(sequences, spans, self.micro_batch_tokens, TRAINING)
        else:
            batches = list(token_budget_batches([len(s) for s in sequences], self.micro_batch_tokens))
        return [[samples[i] for i in batch] for batch in batches]

    def _optimizer_step(self, micro_batches: dict[int, list[list[TrainingSample]]], passes: dict[int, int],
                        num_eligible: int) -> StepRecord:
        """One AdamW step on this rank's micro-batches of each gradient record. Record r runs
        in ``passes[r]`` forward/backward passes (the most any rank has; the rest pad), the
        last of them synchronising gradients over ranks, so that its contribution (the
        gradients it leaves, before the earlier records' are added back) is measured whole.
        ``num_eligible``: the mini-batch's action tokens over all ranks, the loss's
        normalizer. ``metrics`` describe this rank's part."""
        self.optimizer.zero_grad(set_to_none=True)
        total_loss, metric_sums, record_norms = 0.0, {}, []
        earlier: list[torch.Tensor | None] = [None] * len(self.model.parameters)
        for record, record_passes in passes.items():
            for index in range(record_passes):
                with self.model.gradient_sync(index == record_passes - 1):
                    if index >= len(micro_batches[record]):
                        self.model.padding_pass()
                        continue
                    loss, metrics = self._loss(micro_batches[record][index], num_eligible)
                    (loss * self.model.loss_scale).backward()
                    total_loss += loss.item()
                    add_metrics(metric_sums, metrics, sum(s.num_action_tokens for s in micro_batches[record][index]) / num_eligible)
            record_norms.append(self.model.grad_norm(None))
            earlier = self._fold_gradients(earlier)
        for parameter, grad in zip(self.model.parameters, earlier):
            parameter.grad = grad
        total_loss = all_reduce_sum([total_loss], self.ranks)[0]
        grad_norm = self.model.grad_norm(self.max_grad_norm)
        if not (math.isfinite(total_loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            return StepRecord(total_loss, grad_norm, True, metric_sums, record_norms)
        self.optimizer.step()
        return StepRecord(total_loss, grad_norm, False, metric_sums, record_norms)

    def _fold_gradients(self, earlier: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Take the gradients the last record left off the parameters, added to ``earlier``
        (the records before it), so that the next record's are its own."""
        folded = []
        for parameter, before in zip(self.model.parameters, earlier):
            grad, parameter.grad = parameter.grad, None
            folded.append(before if grad is None else grad if before is None else before.add_(grad))
        return folded

    def _loss(self, micro: list[TrainingSample], num_eligible: int) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped loss of one micro-batch, normalised by the mini-batch's ``num_eligible``,
        plus the distillation term's where it is on."""
        allowed = joined_allowed((s.allowed, s.num_action_tokens) for s in micro)
        spans = [(s.action_start, len(s.input_ids)) for s in micro]
        sequences = [s.input_ids for s in micro]
        distributions = self.distill_coef > 0 and self.distill != "sampled"
        if distributions:
            if any(s.teacher is None for s in micro):
                raise ValueError(f"learner.distill={self.distill} needs each sample's teacher distribution (hindsight "
                                 "scoring with ScoringOptions.teacher set)")
            parts, divergences = self.model.forward_with_teacher(sequences, spans, allowed,
                                                                 TeacherSupport.cat([s.teacher for s in micro]))
            logprobs = torch.cat(parts)
        else:
            logprobs = torch.cat(self.model.forward(sequences, spans, allowed))
        own = logprobs.detach().split([s.num_action_tokens for s in micro])
        old = torch.cat([mine if s.old_logprobs is None else s.old_logprobs.to(logprobs.device) for s, mine in zip(micro, own)])
        credit = torch.cat([s.credit for s in micro]).to(logprobs.device)
        loss, metrics = clipped_policy_loss(logprobs, old, credit, self.clip_eps_low, self.clip_eps_high, self.clip_ratio_c,
                                            num_eligible)
        if distributions:
            loss = loss + self.distill_coef * divergences.sum() / max(num_eligible, 1)
            metrics["loss/distill_jsd"] = divergences.mean().item() if divergences.numel() else 0.0
        elif self.distill_coef > 0:
            if any(s.teacher_logprobs is None for s in micro):
                raise ValueError("learner.distill_coef > 0 needs each sample's teacher_logprobs (hindsight scoring)")
            teacher = torch.cat([s.teacher_logprobs for s in micro]).to(logprobs.device)
            distill, distill_metrics = sampled_distill_loss(logprobs, old, teacher, num_eligible)
            loss = loss + self.distill_coef * distill
            metrics.update(distill_metrics)
        return loss, metrics
