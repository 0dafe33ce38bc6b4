"""A training step's batch: its tasks played, then scored by the weights that played them.

The trainer asks for step k's batch with a :class:`RolloutJob` and gets a
:class:`ScoredBatch` back: the trajectories, their hindsight scores (HP-RLVR) or behaviour
log-probs (GRPO's replay), and the credit viewer's views, all computed under one snapshot
of the weights, whose version every trajectory records. Two sources serve jobs:

* :class:`InlineRollouts` (``trainer.off_policy_steps=0``): in the trainer's process, when
  the batch is asked for, on the learner's own weights (the synchronous loop);
* :class:`hp_agent.async_rollout.RolloutProcess` (``trainer.off_policy_steps`` >= 1): in a
  process of its own, that many steps ahead of the learner, on weights handed over
  through shared memory after each update.

Both run :func:`play_and_score`, so the two loops differ only in where and when it runs.
"""

from __future__ import annotations

import resource
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hp_agent.config import ModelConfig, TrainConfig
from hp_agent.credit_view import pick_for_view, scored_view
from hp_agent.distributed import Ranks
from hp_agent.envs.pool import EnvPool, make_env_pool
from hp_agent.hindsight import ScoringOptions, TrajectoryScores, score_trajectories, unreplayed_scores
from hp_agent.policies import LoadOptions, Policy, SamplingParams
from hp_agent.policies.lora import maybe_apply_lora
from hp_agent.rollout import Episode, PhaseTimes, collect, sampled_tokens_bound
from hp_agent.trajectory import Trajectory, usable_indices


@dataclass(frozen=True)
class RolloutJob:
    """What to play for training step ``step``: this rank's ``task_ids`` (G episodes each,
    seeded from ``first_seed`` on), by the weights after ``version`` learner updates, with
    credit views of ``views`` trajectories (0: none)."""

    step: int
    task_ids: list[str]
    first_seed: int
    version: int
    views: int = 0


@dataclass
class ScoredBatch:
    """One job's result. ``trajectories``: every episode, errored ones too (logged, never
    trained); ``usable``: the indices of the kept ones (:func:`usable_indices`), which
    ``scores`` follow one for one (empty until :func:`score` ran); ``views``: (index among the kept, view without credit);
    ``version``: the learner updates applied to the weights that played and scored it;
    ``times``: the seconds of each rollout-side phase."""

    step: int
    version: int
    trajectories: list[Trajectory]
    usable: list[int]
    scores: list[TrajectoryScores]
    views: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    times: PhaseTimes = field(default_factory=PhaseTimes)

    @property
    def kept(self) -> list[Trajectory]:
        return [self.trajectories[k] for k in self.usable]


def play_and_score(policy: Policy, envs: EnvPool, config: TrainConfig, job: RolloutJob, hindsight: bool, replay: bool,
                   times: PhaseTimes | None = None) -> ScoredBatch:
    """Play ``job`` with ``policy``, then score it and take its credit views with the same
    weights. ``times`` collects the phases."""
    batch = play(policy, envs, config, job, times)
    score(policy, batch, config, hindsight, replay)
    add_views(policy, batch, config, job.views)
    return batch


def play(policy: Policy, envs: EnvPool, config: TrainConfig, job: RolloutJob, times: PhaseTimes | None = None) -> ScoredBatch:
    """Play ``job`` with ``policy``: every episode, its trajectories stamped with the job's
    weight version, not scored yet (``scores`` empty)."""
    times = times if times is not None else PhaseTimes()
    group_size = config.algo.rollouts_per_prompt
    episodes = [Episode(task_id, group=g) for g, task_id in enumerate(job.task_ids) for _ in range(group_size)]
    sampling = SamplingParams(config.rollout.max_new_tokens, config.rollout.temperature, config.rollout.top_p)
    trajectories = collect(policy, envs, config.env.name, episodes, sampling, config.rollout.max_turns,
                           seed=job.first_seed, times=times, chat_history=config.rollout.chat_history,
                           truncated_invalid=config.rollout.truncated_turn == "invalid",
                           constrain=config.rollout.constrain_to_admissible, history_tokens=config.rollout.history_tokens)
    # vllm with model.vllm.sleep: free the engine's GPU memory (counted with the weight sync that wakes it)
    times.add("time/weight_sync", policy.release_memory())
    for trajectory in trajectories:
        trajectory.policy_version = job.version
    # Errored episodes (an env that raised, crashed or hung) go no further than the log.
    return ScoredBatch(job.step, job.version, trajectories, usable_indices(trajectories), [], times=times)


def score(policy: Policy, batch: ScoredBatch, config: TrainConfig, hindsight: bool, replay: bool,
          times: PhaseTimes | None = None, count: int | None = None) -> None:
    """Score the next ``count`` (default: all the rest) of ``batch``'s usable trajectories not
    scored yet with ``policy``, which must hold the weights that played them: ``hindsight``
    (the credit rule's, e.g. HP-RLVR) or, with ``replay``, the behaviour log-probs alone;
    neither: the learner's own pass stands for them (:func:`unreplayed_scores`). The
    seconds go to ``times`` (default: the batch's own)."""
    times = times if times is not None else batch.times
    done = len(batch.scores)
    todo = batch.kept[done:] if count is None else batch.kept[done:done + count]
    if not todo:
        return
    started = time.perf_counter()
    if hindsight or replay:
        batch.scores += score_trajectories(policy, todo, ScoringOptions.from_config(config), with_hindsight=hindsight)
    else:
        batch.scores += unreplayed_scores(todo)
    times.add("time/hindsight" if hindsight else "time/replay", time.perf_counter() - started)


def add_views(policy: Policy, batch: ScoredBatch, config: TrainConfig, views: int, times: PhaseTimes | None = None) -> None:
    """``views`` credit views of the scored ``batch``, taken with ``policy`` (the weights
    that played it); their credit is filled in by the learner."""
    if not views:
        return
    times = times if times is not None else batch.times
    started = time.perf_counter()
    kept, scoring = batch.kept, ScoringOptions.from_config(config)
    batch.views = [(pick, scored_view(policy, kept[pick], batch.scores[pick].weights, scoring, config.trainer.view_top_k))
                   for pick in pick_for_view(kept, views)]
    times.add("time/views", time.perf_counter() - started)


def training_env_pool(config: TrainConfig, ranks: Ranks) -> EnvPool:
    """The env slots one rank plays a step on: its share of the prompts, G episodes each."""
    num_envs = config.trainer.prompts_per_step // ranks.world_size * config.algo.rollouts_per_prompt
    return make_env_pool(config.env.name, num_envs=num_envs, num_workers=config.env.num_workers,
                         env_kwargs=config.env.kwargs, step_timeout=config.env.step_timeout,
                         reset_timeout=config.env.reset_timeout)


def load_training_policy(model: ModelConfig, device: str, sampled_tokens: int | None = None) -> Policy:
    """The policy ``model`` describes on ``device``, with its LoRA adapter where it has one.
    ``sampled_tokens``: the longest sequence it samples (:func:`rollout_tokens`), the vllm
    engine's default ``max_model_len``; None for a copy that never samples."""
    options = LoadOptions.from_model_config(model, device)
    policy = (options if sampled_tokens is None else options.sampling_up_to(sampled_tokens)).load(model.name)
    return maybe_apply_lora(policy, model)  # model.lora_rank > 0: train an adapter only (resumes one)


def rollout_tokens(config: TrainConfig, envs: EnvPool) -> int:
    """The longest sequence the run's rollouts on ``envs`` sample, prompt and answer (the
    turns: rollout.max_turns, else the env's limit)."""
    rollout = config.rollout
    return sampled_tokens_bound(rollout.max_new_tokens, rollout.max_turns or envs.max_turns, rollout.chat_history,
                                rollout.history_tokens)


def transformers_only(model: ModelConfig) -> ModelConfig:
    """``model`` on the hf backend: for a process that never samples (one-step-off's learner
    and its scoring copy), which needs no vLLM engine beside the rollout process's."""
    return model.model_copy(update={"backend": "hf"})


def cpu_seconds(envs: EnvPool) -> float:
    """CPU seconds used so far by this process (all threads) and the pool's env workers."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + envs.worker_cpu_seconds()


class InlineRollouts:
    """The synchronous source: plays and scores a job in this process when its batch is
    received, on the learner's own weights. :meth:`start`'s ``hindsight``: whether the
    credit rule scores hindsight; ``replay``: whether the learner needs the behaviour
    log-probs (:meth:`hp_agent.learner.Learner.needs_behaviour_logprobs`)."""

    overlapped = False  # its phases run one after another with the learner's

    def __init__(self, config: TrainConfig, ranks: Ranks):
        self.config, self.envs = config, training_env_pool(config, ranks)
        self.task_ids, self.answer_format = self.envs.task_ids(), self.envs.answer_format
        self.policy: Policy | None = None
        self.hindsight, self.replay = False, True
        self._jobs: deque[RolloutJob] = deque()

    def training_policy(self, model: ModelConfig, device: str) -> Policy:
        """The learner's policy, which samples here too (vllm: its engine sized for this run's rollouts)."""
        return load_training_policy(model, device, rollout_tokens(self.config, self.envs))

    def start(self, policy: Policy, version: int, hindsight: bool, replay: bool) -> None:
        self.policy, self.hindsight, self.replay = policy, hindsight, replay

    def submit(self, job: RolloutJob) -> None:
        self._jobs.append(job)

    def receive(self, times: PhaseTimes) -> ScoredBatch:
        """The next job's batch, played and scored now (its phases in the batch's ``times``)."""
        return play_and_score(self.policy, self.envs, self.config, self._jobs.popleft(), self.hindsight, self.replay)

    def publish(self, version: int) -> float:
        """vllm: copy the updated weights into the rollout engine; hf shares the learner's model (0 s)."""
        return self.policy.sync_weights()

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.envs)

    def close(self) -> None:
        self.envs.close()
