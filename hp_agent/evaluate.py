"""Split evaluation: Avg@k, Pass@k (unbiased), per-task-type success, 95% intervals.

A model policy plays through :func:`hp_agent.rollout.collect`; a scripted ALFWorld
policy (``scripted="walkthrough" | "expert" | "random"``, no model loaded) plays through
the same env API with :func:`hp_agent.envs.alfworld.scripted.play_episodes`. Both give
trajectories, scored the same way.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.progress import Progress

from hp_agent.envs import make
from hp_agent.envs.alfworld.data import SHORT_TASK_TYPES
from hp_agent.policies import Policy, SamplingParams, load_policy
from hp_agent.rollout import Episode, collect
from hp_agent.runs import atomic_write_text
from hp_agent.trajectory import Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    >>> pass_at_k(8, 0, 1), pass_at_k(8, 8, 1), pass_at_k(4, 1, 2)
    (0.0, 1.0, 0.5)
    """
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def wilson_interval(successes: float, trials: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate."""
    if trials == 0:
        return 0.0, 0.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def improvement_p_value(before_successes: int, before_n: int, after_successes: int, after_n: int) -> float:
    """One-sided p-value of "the after-rate is no higher than the before-rate".

    A two-proportion z-test with pooled variance. Two evaluations of the same tasks with
    the same seeds are positively correlated, so this unpaired test errs towards "no
    change". Equal rates of 0 or 1 carry no evidence of a change: p = 1.

    >>> round(improvement_p_value(100, 250, 200, 250), 12), improvement_p_value(0, 10, 0, 10)
    (0.0, 1.0)
    """
    if min(before_n, after_n) < 1:
        raise ValueError("each evaluation needs at least one episode")
    pooled = (before_successes + after_successes) / (before_n + after_n)
    se = math.sqrt(pooled * (1 - pooled) * (1 / before_n + 1 / after_n))
    if se == 0:
        return 1.0
    z = (after_successes / after_n - before_successes / before_n) / se
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass
class EvalResult:
    """Scores of one split. ``avg_at_k``: mean success over all samples; ``pass_at_k``:
    mean over tasks of the unbiased Pass@k; ``success_ci95``: Wilson interval of Avg@k
    over tasks' first samples; ``mean_turns``: env steps per episode; ``policy``: the
    model or scripted policy evaluated; ``per_task_type_tasks``: tasks per task type."""

    env: str
    split: str
    tasks: int
    samples: int
    avg_at_k: float
    pass_at_k: float
    success_ci95: tuple[float, float]
    mean_reward: float
    invalid_fraction: float
    mean_turns: float
    per_task_type: dict[str, float] = field(default_factory=dict)
    errored: int = 0
    policy: str = ""
    per_task_type_tasks: dict[str, int] = field(default_factory=dict)

    @property
    def episodes(self) -> int:
        return self.tasks * self.samples

    @property
    def successes(self) -> int:
        return round(self.avg_at_k * self.episodes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> EvalResult:
        """The result :meth:`to_json` wrote."""
        return cls(**{**data, "success_ci95": tuple(data["success_ci95"])})


def change_lines(before: EvalResult, after: EvalResult, alpha: float = 0.01) -> list[str]:
    """Before/after success over all episodes with 95% intervals, and whether the gain
    is beyond evaluation noise (``improvement_p_value`` < ``alpha``). Like the intervals,
    the test counts tasks as the trials: several samples of one task are correlated."""
    for key in ("env", "split", "tasks", "samples"):
        if getattr(before, key) != getattr(after, key):
            raise ValueError(f"the baseline's {key} is {getattr(before, key)!r}, this evaluation's "
                             f"{getattr(after, key)!r}: compare evaluations of the same tasks")
    lines = []
    for label, result in (("before", before), ("after", after)):
        low, high = result.success_ci95
        lines.append(f"success {label}: {result.successes}/{result.episodes} = {100 * result.avg_at_k:.1f}% "
                     f"[{100 * low:.1f}%, {100 * high:.1f}%]")
    p_value = improvement_p_value(before.avg_at_k * before.tasks, before.tasks, after.avg_at_k * after.tasks, after.tasks)
    verdict = "an improvement beyond evaluation noise" if p_value < alpha else f"no improvement beyond noise (p >= {alpha})"
    lines.append(f"change: {100 * (after.avg_at_k - before.avg_at_k):+.1f} points; one-sided p = {p_value:.2g} "
                 f"(two-proportion z-test): {verdict}")
    return lines


def _type_order(task_type: str) -> tuple[int, str]:
    # ALFWorld's task types in their usual table order, anything else alphabetically after.
    order = SHORT_TASK_TYPES.index(task_type) if task_type in SHORT_TASK_TYPES else len(SHORT_TASK_TYPES)
    return order, task_type


def score(trajectories: list[Trajectory], env: str, split: str, samples: int, policy: str = "") -> EvalResult:
    """Aggregate trajectories (``group`` = task index) into an :class:`EvalResult`."""
    by_task: dict[int, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_task[trajectory.group].append(trajectory)
    type_success: dict[str, list[float]] = defaultdict(list)
    type_tasks: dict[str, int] = defaultdict(int)
    for group in by_task.values():
        type_success[group[0].task_type].extend(float(t.success) for t in group)
        type_tasks[group[0].task_type] += 1
    successes = [float(t.success) for t in trajectories]
    turns = [turn for t in trajectories for turn in t.turns]
    types = sorted(type_success, key=_type_order)
    avg_at_k = sum(successes) / max(len(successes), 1)
    return EvalResult(
        env=env,
        split=str(split),
        tasks=len(by_task),
        samples=samples,
        avg_at_k=avg_at_k,
        pass_at_k=sum(pass_at_k(len(g), sum(t.success for t in g), min(samples, len(g))) for g in by_task.values()) / max(len(by_task), 1),
        # Samples of one task are correlated: the interval counts tasks, not episodes
        # (exact for k = 1, conservative for k > 1).
        success_ci95=wilson_interval(avg_at_k * len(by_task), len(by_task)),
        mean_reward=sum(t.reward for t in trajectories) / max(len(trajectories), 1),
        invalid_fraction=sum(turn.invalid for turn in turns) / max(len(turns), 1),
        mean_turns=len(turns) / max(len(trajectories), 1),
        per_task_type={k: sum(type_success[k]) / len(type_success[k]) for k in types},
        errored=sum(t.errored for t in trajectories),
        policy=policy,
        per_task_type_tasks={k: type_tasks[k] for k in types},
    )


# The held-out split each built-in env is scored on when none is named; other envs get
# their factory's default split.
DEFAULT_EVAL_SPLITS = {"alfworld": "id", "math": "test", "code": "test"}


def evaluate(
    env: str = "alfworld",
    model: str | None = "tiny",
    split: str | None = None,
    samples: int = 1,
    limit: int | None = None,
    env_kwargs: dict | None = None,
    policy: Policy | None = None,
    sampling: SamplingParams | None = None,
    parallel_envs: int = 32,
    seed: int = 0,
    output: str | Path | None = None,
    progress: bool = False,
    scripted: str | None = None,
    workers: int = 1,
    max_turns: int | None = None,
) -> EvalResult:
    """Play every task of a split ``samples`` times in a fixed order and score it.

    ``split`` defaults to the env's held-out split (ALFWorld ``id``, math ``test``).
    ``scripted`` names a scripted ALFWorld policy (walkthrough, expert, random): no model
    is loaded and ``model``/``policy``/``sampling`` are ignored; it plays in ``workers``
    processes. Episode ``i`` (task-major order) is seeded ``seed + i`` either way.
    ``max_turns`` caps a model's episode below the env's own step limit (CPU-scale runs).
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    kwargs = dict(env_kwargs or {})
    split = split or kwargs.get("split") or DEFAULT_EVAL_SPLITS.get(env)
    if env == "alfworld" and limit:
        # The same type-balanced prefix as task_ids()[:limit]; synthesized games are then
        # built only for the games played.
        kwargs.setdefault("num_games", limit)
    if split is not None:
        kwargs["split"] = split
    if scripted is not None:
        from hp_agent.envs.alfworld.scripted import make_scripted

        make_scripted(scripted)  # a bad name fails before any env is built
        first = make(env, **kwargs)
        task_ids = first.task_ids()[:limit] if limit else first.task_ids()
        trajectories = _play_scripted(first, env, kwargs, scripted, task_ids, samples, seed, workers, progress)
        label = f"scripted:{scripted}"
    else:
        label = type(policy).__name__ if policy is not None else str(model or "tiny")
        policy = policy if policy is not None else load_policy(model or "tiny")
        envs = [make(env, **kwargs) for _ in range(parallel_envs)]
        try:
            task_ids = envs[0].task_ids()[:limit] if limit else envs[0].task_ids()
            trajectories = _play_model(policy, envs, env, split, task_ids, samples, sampling, parallel_envs, seed,
                                       progress, max_turns)
        finally:
            for instance in envs:
                instance.close()
    result = score(trajectories, env, str(split), samples, policy=label)
    if output is not None:
        atomic_write_text(Path(output), result.to_json())
    return result


def _play_model(policy: Policy, envs: list, env: str, split: str | None, task_ids: list[str], samples: int,
                sampling: SamplingParams | None, parallel_envs: int, seed: int, progress: bool,
                max_turns: int | None) -> list[Trajectory]:
    episodes = [Episode(task_id, group=g) for g, task_id in enumerate(task_ids) for _ in range(samples)]
    sampling = sampling or SamplingParams()
    trajectories: list[Trajectory] = []
    # Sampling draws from torch's generator: seed it so that an evaluation repeats
    # exactly, and fork it so that the caller's stream (a training run's) is untouched.
    with torch.random.fork_rng(devices=[]), Progress(disable=not progress, transient=True) as bar:
        torch.manual_seed(seed)
        job = bar.add_task(f"eval {env}/{split}", total=len(episodes))
        for start in range(0, len(episodes), parallel_envs):
            chunk = episodes[start : start + parallel_envs]
            trajectories += collect(policy, envs, env, chunk, sampling, max_turns, seed=seed + start)
            bar.advance(job, len(chunk))
    return trajectories


def _play_scripted(first, env: str, kwargs: dict, scripted: str, task_ids: list[str], samples: int, seed: int,
                   workers: int, progress: bool) -> list[Trajectory]:
    from hp_agent.envs.alfworld.scripted import Job, play_episodes

    jobs = [Job(task_id, g, seed + g * samples + k) for g, task_id in enumerate(task_ids) for k in range(samples)]
    with Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task(f"eval {env}/{kwargs.get('split')} ({scripted})", total=len(jobs))
        try:
            return play_episodes(first, kwargs, scripted, jobs, env_name=env, workers=workers,
                                 on_done=lambda _: bar.advance(job))
        finally:
            first.close()
