"""The training loop: rollout -> hindsight -> credit -> learner, one step at a time.

Read top to bottom: :func:`train` sets up (seeding, run folder, policy, learner), then
each step takes its tasks, gets them played and scored (:mod:`hp_agent.scored_batch`),
assigns credit, updates the weights, logs metrics with per-phase timings and checkpoints.
With ``trainer.off_policy_steps=0`` the batch is played and scored right there, on the
learner's weights; with k >= 1 a rollout process plays step t + k's batch while the
learner trains on step t's (:mod:`hp_agent.async_rollout`). ``resume`` continues a killed
run from its last complete checkpoint, losing at most the steps in flight.
"""

from __future__ import annotations

import random
import time
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from hp_agent.async_rollout import RolloutProcess
from hp_agent.config import TrainConfig, load_config, save_config
from hp_agent.credit.assembly import answer_format_masks, assign_credit
from hp_agent.credit.baseline import HistoricalBaseline
from hp_agent.credit_view import VIEWS_FILE, with_credit
from hp_agent.devices import check_device
from hp_agent.distributed import SINGLE, Ranks, all_gather, all_reduce_sum, init_from_env, shard
from hp_agent.errors import UserError, UserFileExistsError, UserFileNotFoundError, UserValueError
from hp_agent.learner import Learner, StepRecord, add_metrics
from hp_agent.memory_plan import check_memory
from hp_agent.policies.lora import save_model
from hp_agent.progress import LoopProgress
from hp_agent.rollout import PhaseTimes
from hp_agent.run_folder import latest_checkpoint, resume_checkpoint
from hp_agent.runs import JsonlLog, MetricsWriter, load_checkpoint_state, save_checkpoint
from hp_agent.scored_batch import InlineRollouts, RolloutJob, ScoredBatch
from hp_agent.trajectory import Trajectory


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (e.g. the loss stayed non-finite); the message says why."""


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    final_metrics: dict[str, float] = field(default_factory=dict)
    zero_grad_records: int = 0
    grad_records: int = 0
    checkpoint: Path | None = None


class TaskSampler:
    """Task ids in a seeded random order, epoch after epoch."""

    def __init__(self, task_ids: list[str], seed: int):
        self.task_ids, self.seed = list(task_ids), seed
        self.epoch, self.position = 0, 0

    @property
    def state(self) -> tuple[int, int]:
        """Where the next take starts: (epoch, position)."""
        return self.epoch, self.position

    def take(self, n: int) -> list[str]:
        out = []
        while len(out) < n:
            order = self.task_ids[:]
            random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
            take = order[self.position : self.position + n - len(out)]
            out += take
            self.position += len(take)
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return out


def rollout_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """The step's rollout metrics; reward and success over the episodes that did not error (they have no outcome)."""
    n = max(len(trajectories), 1)
    finished = [t for t in trajectories if not t.errored]
    turns = [turn for t in trajectories for turn in t.turns]
    return {
        "rollout/reward_mean": sum(t.reward for t in finished) / max(len(finished), 1),
        "rollout/success_rate": sum(t.success for t in finished) / max(len(finished), 1),
        "rollout/turns_mean": len(turns) / n,
        "rollout/action_tokens_mean": sum(len(turn.action_ids) for turn in turns) / max(len(turns), 1),
        "rollout/invalid_fraction": sum(turn.invalid for turn in turns) / max(len(turns), 1),
        "rollout/truncated_fraction": sum(t.truncated for t in trajectories) / n,
        "rollout/truncated_turns": float(sum(turn.truncated for turn in turns)),  # cut before their end-of-turn token
        "rollout/errored": float(sum(t.errored for t in trajectories)),
    }


@dataclass
class TrainState:
    """What a checkpoint restores beside the weights and the optimizer, so that a resumed
    run continues as if it had never stopped: the step, the historical baseline, the task
    order, the random generators and the gradient-record counts."""

    step: int
    baseline: HistoricalBaseline
    sampler: TaskSampler
    totals: dict[str, int] = field(default_factory=lambda: {"zero_grad_records": 0, "grad_records": 0, "nonfinite_in_a_row": 0})

    def state_dict(self, ranks: Ranks = SINGLE, sampler: tuple[int, int] | None = None) -> dict:
        """The state; every rank's random generators (each samples its own episodes).
        ``sampler``: the task order's position to save in place of the sampler's own (the
        one before the tasks of batches still in flight were taken, so that a resumed run
        plays them again)."""
        own_rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        return {
            "step": self.step,
            "baseline": self.baseline.state_dict(),
            "sampler": sampler or self.sampler.state,
            "rng": all_gather(own_rng, ranks),
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: dict, ranks: Ranks = SINGLE) -> None:
        if len(state["rng"]) != ranks.world_size:
            raise UserValueError(f"the checkpoint was written by {len(state['rng'])} ranks; resume it with as many, "
                                 f"not {ranks.world_size}")
        self.step, self.totals = state["step"], dict(state["totals"])
        self.baseline.load_state_dict(state["baseline"])
        self.sampler.epoch, self.sampler.position = state["sampler"]
        rng = state["rng"][ranks.rank]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])


class _Discard:
    """A log that keeps nothing: what ranks other than 0 write to."""

    def write(self, *record: object) -> None:
        pass


@dataclass
class RunLogs:
    """The run's JSONL logs; a resumed run first drops what was logged after its checkpoint.
    Only rank 0 writes; the others get logs that discard."""

    metrics: MetricsWriter | _Discard
    grad_norms: JsonlLog | _Discard
    trajectories: JsonlLog | _Discard | None
    views: JsonlLog | None  # rank 0 alone records views

    @classmethod
    def open(cls, run_dir: Path, config: TrainConfig, resume_step: int | None, resources: ExitStack,
             ranks: Ranks = SINGLE) -> RunLogs:
        trainer = config.trainer
        if not ranks.is_main:
            return cls(_Discard(), _Discard(), _Discard() if trainer.save_trajectories else None, None)

        def log(path: Path, max_bytes: int | None = None) -> JsonlLog:
            return resources.enter_context(closing(JsonlLog(path, resume_step=resume_step, max_bytes=max_bytes)))

        metrics = resources.enter_context(closing(MetricsWriter(run_dir, resume_step, trainer.wandb_project,
                                                                config.model_dump())))
        return cls(metrics, log(run_dir / "grad_norms.jsonl"),
                   log(run_dir / "trajectories.jsonl") if trainer.save_trajectories else None,
                   log(run_dir / VIEWS_FILE, int(trainer.view_max_mb * 1e6)) if trainer.views_per_step else None)


def train(
    config: TrainConfig | dict | str | Path | None = None,
    resume: str | Path | None = None,
    progress: bool = True,
    overrides: list[str] | None = None,
) -> RunSummary:
    """Train a policy as ``config`` says (then dotted ``overrides``, e.g. ``learner.lr=1e-4``).

    With ``resume`` (a run folder), continue that run from its last checkpoint; its saved
    config is used unless ``config`` is given. Under ``torchrun`` every rank calls this:
    each plays its share of a step's prompts, and rank 0 alone writes the run folder.
    """
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise UserFileNotFoundError(f"{str(run_dir)!r} is not a run folder (no config.yaml)")
        config = _as_config(run_dir / "config.yaml" if config is None else config, overrides)
        checkpoint = resume_checkpoint(run_dir)  # the newest that matches its manifest, a damaged one skipped aloud
    else:
        config = _as_config(config, overrides)
        name = config.trainer.name or f"{config.env.name}-{config.algo.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir, checkpoint = Path(config.trainer.run_dir) / name, None
    check_device(config.model.device)  # before a process group or anything else starts on it
    ranks = init_from_env(config.model.device)
    if config.trainer.check_memory:  # from config.json alone: a run that cannot fit stops before it loads
        _check_memory_on_every_rank(config, ranks)
    run_dir = all_gather(run_dir, ranks)[0]  # rank 0's clock names the run
    # Rank 0 alone looks: it may already have made the folder when another rank got here.
    if resume is None and ranks.is_main and (run_dir / "config.yaml").exists():
        raise UserFileExistsError(f"run folder {str(run_dir)!r} exists; resume it with --resume or pick another name")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserFileExistsError(f"run folder {str(run_dir)!r} is a file; pick another trainer.name or trainer.run_dir")
    if config.trainer.prompts_per_step % ranks.world_size:
        raise UserValueError(f"trainer.prompts_per_step={config.trainer.prompts_per_step} does not split evenly over "
                             f"{ranks.world_size} ranks; use a multiple of {ranks.world_size}")
    # Env workers and log files are closed however the run ends (an error mid-step too).
    with ExitStack() as resources:
        return _train(config, run_dir, checkpoint, resume is not None, progress and ranks.is_main, resources, ranks)


def _check_memory_on_every_rank(config: TrainConfig, ranks: Ranks) -> None:
    """The memory plan against each rank's own device; where one rank's does not fit, every
    rank stops with its line (a rank stopping alone would leave the others waiting on it)."""
    try:
        check_memory(config, ranks.world_size)
        refusal = None
    except UserValueError as error:
        refusal = f"rank {ranks.rank}: {error}" if ranks.enabled else str(error)
    refused = [line for line in all_gather(refusal, ranks) if line is not None]
    if refused:
        raise UserValueError(refused[0])


def _train(config: TrainConfig, run_dir: Path, checkpoint: Path | None, resuming: bool, progress: bool,
           resources: ExitStack, ranks: Ranks) -> RunSummary:
    # --- set-up: envs, policy, learner, the resumable state, logs --------------------
    _seed_everything(config.trainer.seed + ranks.rank, config.trainer.torch_threads)  # ranks sample apart
    off_policy = config.trainer.off_policy_steps
    model = config.model.model_copy(update={"name": str(checkpoint / "model")}) if checkpoint else config.model
    # The env pool lives where the batches are played: here, or in the rollout process it starts.
    rollouts = resources.enter_context(closing(RolloutProcess(config, ranks, model) if off_policy
                                               else InlineRollouts(config, ranks)))
    policy = rollouts.training_policy(model, ranks.device(model.device))  # one-step-off: no vLLM engine here
    if ranks.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)  # only once env and model are known to load
        save_config(config, run_dir / "config.yaml")
    learner = Learner.from_config(policy, config, ranks)
    saved = None
    if checkpoint is not None:
        learner.load(checkpoint)
        saved = load_checkpoint_state(checkpoint)
    first_step = saved["step"] if saved else 0
    # No replay where the learner does not need one: synchronous, its own pass runs on the snapshot's weights.
    rollouts.start(policy, first_step, hindsight=config.scores_hindsight,
                   replay=learner.needs_behaviour_logprobs(config.trainer.prompts_per_step))
    state = TrainState(0, HistoricalBaseline(**config.baseline.model_dump()), TaskSampler(rollouts.task_ids, config.trainer.seed))
    if saved is not None:
        state.load_state_dict(saved, ranks)
    logs = RunLogs.open(run_dir, config, state.step if resuming else None, resources, ranks)
    rule, credit_options = config.algo.rule, config.credit_options
    summary = RunSummary(run_dir=run_dir, steps=state.step)
    taken_before: dict[int, tuple[int, int]] = {}  # step -> the task order's position before its tasks were taken

    def submit(step: int) -> None:
        """Take step ``step``'s P prompts (this rank's P / W of them, G samples each; seeds as one process's)."""
        taken_before[step] = state.sampler.state
        task_ids = shard(state.sampler.take(config.trainer.prompts_per_step), ranks)
        episodes = len(task_ids) * config.algo.rollouts_per_prompt
        views = logs.views is not None and not logs.views.full and (
            step % config.trainer.view_every == 0 or step + 1 == config.trainer.steps)
        rollouts.submit(RolloutJob(step, task_ids, first_seed=config.trainer.seed + (step * ranks.world_size + ranks.rank) * episodes,
                                   version=max(step - off_policy, first_step), views=config.trainer.views_per_step if views else 0))

    # --- the loop ------------------------------------------------------------------
    for step in range(first_step, min(first_step + off_policy, config.trainer.steps)):
        submit(step)  # one-step-off: the batches the rollout process plays before the first update
    with LoopProgress("train", config.trainer.steps, enabled=progress, completed=state.step) as bar:
        for step in range(state.step, config.trainer.steps):
            step_start, cpu_start = time.perf_counter(), rollouts.cpu_seconds()
            times = PhaseTimes()

            # 1. rollout and 2. hindsight scoring (HP-RLVR) or behaviour-policy replay (GRPO), with the
            # snapshot that generated: played here now (synchronous), or by the rollout process while
            # the learner trained on the step before (one-step-off, then scored by the rollout process or,
            # with trainer.learner_scoring_share, partly here), which plays step + k's batch next.
            if step + off_policy < config.trainer.steps:
                submit(step + off_policy)
            batch = rollouts.receive(times)  # one-step-off: the wait for it (and the learner's share of the scoring) in times
            _check_batch(batch, step, max(step - off_policy, first_step))
            kept = batch.kept
            slots = [ranks.rank * len(batch.trajectories) + k for k in batch.usable]  # places in the global order

            # 3. credit (then the baseline's update), 4. the policy update
            format_masks = answer_format_masks(policy, kept, rollouts.answer_format)
            samples, credit_metrics = assign_credit(kept, batch.scores, rule, credit_options, state.baseline, format_masks,
                                                    ranks, mask_truncated=config.rollout.truncated_turn == "mask")
            for pick, view in batch.views:  # scored under the snapshot that generated; credit from here
                sample_credit = [sample.credit for sample in samples[pick]]
                logs.views.write({"step": step, "algo": config.algo.name, **with_credit(view, sample_credit)})
            started = time.perf_counter()
            records = learner.step(samples, slots)
            times.add("time/train", time.perf_counter() - started)
            # Hand the new weights to the rollouts: vllm's engine, or the rollout process's slot (hf inline: 0 s).
            times.add("time/weight_sync", rollouts.publish(step + 1))

            # 5. bookkeeping: logs (every rank's trajectories; rank 0's credit and times), then a
            # checkpoint every checkpoint_every steps and at the end
            train_metrics = _account_grad_records(records, state.totals, step, logs.grad_norms, config.learner.max_nonfinite_steps)
            trajectories = batch.trajectories
            everyone = [t for part in all_gather(trajectories, ranks) for t in part] if ranks.enabled else trajectories
            for trajectory in everyone if logs.trajectories is not None else ():
                logs.trajectories.write({"step": step, **trajectory.to_dict()})
            total = time.perf_counter() - step_start
            phases = _merged(batch.times, times)
            metrics = {**rollout_metrics(everyone), **credit_metrics, **train_metrics, **phases.seconds}
            # Overlapped, the rollout's phases ran beside the learner's: the residual is the learner's own.
            counted = times if rollouts.overlapped else phases
            metrics["time/residual"] = max(total - sum(counted.seconds.values()), 0.0)
            metrics["time/total"] = total
            if rollouts.overlapped:
                metrics["async/staleness"] = float(step - batch.version)  # learner updates the batch's weights missed
            # the trainer's process and its env workers (or its rollout process's); with several ranks, all of them
            metrics["cpu/step_s"] = all_reduce_sum([max(rollouts.cpu_seconds() - cpu_start, 0.0)], ranks)[0]
            if torch.cuda.is_available() and policy.device.type == "cuda":  # rank 0's device, since the run started
                free_bytes, device_bytes = torch.cuda.mem_get_info(policy.device)
                metrics["gpu/peak_memory_gib"] = torch.cuda.max_memory_allocated(policy.device) / (1 << 30)  # torch's allocator
                metrics["gpu/device_used_gib"] = (device_bytes - free_bytes) / (1 << 30)  # all on the device (vLLM's too)
            logs.metrics.write(step, metrics)
            state.step = summary.steps = step + 1
            summary.final_metrics = metrics
            if state.step % config.trainer.checkpoint_every == 0 or state.step == config.trainer.steps:
                # The batches in flight are not saved: the task order goes back to before their tasks were taken.
                summary.checkpoint = save_checkpoint(run_dir, state.step, partial(save_model, policy.model, policy.tokenizer),
                                                     learner.save, state.state_dict(ranks, taken_before.get(step + 1)),
                                                     config.trainer.keep_checkpoints, ranks)
            taken_before.pop(step, None)
            bar.advance(1, step_status(metrics, full=not bar.terminal))
    summary.zero_grad_records, summary.grad_records = state.totals["zero_grad_records"], state.totals["grad_records"]
    summary.checkpoint = summary.checkpoint or latest_checkpoint(run_dir)
    return summary


def _check_batch(batch: ScoredBatch, step: int, version: int) -> None:
    """The batch trained at ``step`` is that step's, generated by the weights after ``version`` updates."""
    versions = {t.policy_version for t in batch.trajectories}
    if batch.step != step or versions - {version}:
        raise RuntimeError(f"step {step} received the batch of step {batch.step} generated by weights version(s) "
                           f"{sorted(versions)}; expected version {version}")


def _merged(rollout: PhaseTimes, learner: PhaseTimes) -> PhaseTimes:
    """The rollout side's phase seconds, then the learner's, added where both have one."""
    merged = PhaseTimes(dict(rollout.seconds))
    for phase, seconds in learner.seconds.items():
        merged.add(phase, seconds)
    return merged


def step_status(metrics: dict[str, float], full: bool) -> str:
    """A step in one line: reward, success, zero-gradient records and (``full``) each phase's seconds."""
    status = (f"reward {metrics['rollout/reward_mean']:.3f} success {metrics['rollout/success_rate']:.2f} "
              f"zero-grad {metrics['train/zero_grad_records']:.0f}")
    if not full:
        return f"{status}  {metrics['time/total']:.1f}s/step"
    phases = " ".join(f"{key.removeprefix('time/')} {value:.1f}s" for key, value in metrics.items()
                      if key.startswith("time/") and key != "time/total")
    return f"{status} | {phases} | total {metrics['time/total']:.1f}s"


def _seed_everything(seed: int, torch_threads: int) -> None:
    torch.set_num_threads(torch_threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _account_grad_records(
    records: list[StepRecord], totals: dict[str, int], step: int, grad_log: JsonlLog, max_nonfinite: int
) -> dict[str, float]:
    """Log each gradient record (one row of grad_norms.jsonl: its own contribution's norm) of
    each optimizer step; stop after ``max_nonfinite`` non-finite optimizer steps in a row."""
    metrics: dict[str, float] = {}
    norms = [norm for record in records for norm in record.record_norms]
    for index, record in enumerate(records):
        for position, norm in enumerate(record.record_norms):
            grad_log.write({"step": step, "optimizer_step": index, "record": position, "grad_norm": norm,
                            "skipped_nonfinite": record.skipped_nonfinite})
        totals["nonfinite_in_a_row"] = totals["nonfinite_in_a_row"] + 1 if record.skipped_nonfinite else 0
        if totals["nonfinite_in_a_row"] >= max_nonfinite:
            raise TrainingError(
                f"step {step}: the loss or gradient was not finite in {max_nonfinite} optimizer steps in a row; "
                "lower learner.lr or check the model's dtype (float32 on CPU)"
            )
        add_metrics(metrics, record.metrics, 1 / len(records))
    totals["grad_records"] += len(norms)
    totals["zero_grad_records"] += sum(norm == 0.0 for norm in norms)
    if records:
        metrics["loss/policy"] = sum(r.loss for r in records) / len(records)
        metrics["train/grad_norm"] = sum(r.grad_norm for r in records) / len(records)
    metrics["train/optimizer_steps"] = float(len(records))
    metrics["train/grad_records"] = float(len(norms))
    metrics["train/zero_grad_records"] = float(sum(norm == 0.0 for norm in norms))
    metrics["train/nonfinite_skipped"] = float(sum(r.skipped_nonfinite for r in records))
    metrics["train/zero_grad_records_total"] = float(totals["zero_grad_records"])
    metrics["train/grad_records_total"] = float(totals["grad_records"])
    return metrics


def _as_config(config: TrainConfig | dict | str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    if isinstance(config, TrainConfig):
        return load_config(base=config.model_dump(), overrides=overrides) if overrides else config
    if isinstance(config, dict):
        return load_config(base=config, overrides=overrides)
    return load_config(config, overrides)
