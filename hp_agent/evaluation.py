"""Split evaluation: Avg@k, Pass@k (unbiased), per-task-type success, 95% intervals.

A :class:`Player` plays the episodes: a model through :func:`hp_agent.rollout.collect`,
or a scripted ALFWorld policy (``scripted="walkthrough" | "expert" | "random"``, no model
loaded) as a :class:`~hp_agent.scripted_play.ScriptedActor` through
:func:`hp_agent.rollout.play`, the same loop. Both give trajectories, scored the same way. What differs between envs (the held-out
split, the order of task types, how to prepare only N tasks) the env class says.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import queue
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hp_agent.envs import TextEnv, env_factory, make, split_env_spec
from hp_agent.envs.pool import EnvPool
from hp_agent.errors import UserError, UserValueError
from hp_agent.files import atomic_write_text
from hp_agent.policies import LoadOptions, Policy, SamplingParams
from hp_agent.policies.resolve import resolve_model
from hp_agent.progress import LoopProgress
from hp_agent.rollout import Actor, Episode, collect, play, sampled_tokens_bound
from hp_agent.run_folder import model_source
from hp_agent.trajectory import Trajectory

if TYPE_CHECKING:
    from hp_agent.config import TrainConfig


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
            raise UserValueError(f"the baseline's {key} is {getattr(before, key)!r}, this evaluation's "
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


def score(trajectories: list[Trajectory], env: str, split: str, samples: int, policy: str = "",
          task_type_order: tuple[str, ...] = ()) -> EvalResult:
    """Aggregate trajectories (``group`` = task index) into an :class:`EvalResult`; task
    types are reported in ``task_type_order``, any others alphabetically after."""
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
    types = sorted(type_success, key=lambda t: (task_type_order.index(t) if t in task_type_order else len(task_type_order), t))
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


class Player(Protocol):
    """What plays an evaluation's episodes: a model through :func:`~hp_agent.rollout.collect`,
    or a scripted policy that answers from the env's state (no model)."""

    label: str

    def play(self, episodes: list[Episode], seed: int, on_done: Callable[[int], None]) -> list[Trajectory]:
        """Play ``episodes`` in order, episode ``i`` seeded ``seed + i``; ``on_done(n)`` after n finish."""
        ...


@dataclass
class ModelPlayer:
    policy: Policy
    envs: list[TextEnv]
    env_name: str
    sampling: SamplingParams
    max_turns: int | None
    label: str
    constrain: bool = False  # each response one of the env's admissible actions (rollout.constrain_to_admissible)
    chat_history: bool = False  # prompt with the whole conversation (rollout.chat_history)

    def play(self, episodes: list[Episode], seed: int, on_done: Callable[[int], None]) -> list[Trajectory]:
        # Sampling draws from torch's generator: seed it so that an evaluation repeats
        # exactly, and fork it so that the caller's stream (a training run's) is untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return collect(self.policy, self.envs, self.env_name, episodes, self.sampling, self.max_turns, seed=seed,
                           chat_history=self.chat_history, constrain=self.constrain,
                           on_wave=lambda wave: on_done(len(wave)))


def _library_verbosity() -> tuple[int, bool]:
    from transformers.utils import logging as hf_logging

    return hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()


@dataclass
class ShardedModelPlayer:
    """A model loaded in ``workers`` processes, each playing a contiguous share of the
    episodes (episode ``i`` is still seeded ``seed + i``) on this process's torch threads.
    Each worker seeds its own sampler with its share's first seed, so sampled episodes
    repeat for a given ``workers`` but differ from one process's; greedy ones match."""

    model: str
    env_name: str
    env_kwargs: dict
    sampling: SamplingParams
    max_turns: int | None
    workers: int
    parallel_envs: int
    label: str
    constrain: bool = False
    chat_history: bool = False
    load: LoadOptions = field(default_factory=LoadOptions)
    # transformers' log verbosity and progress bars as this process has them, for the workers
    library_verbosity: tuple[int, bool] = field(default_factory=_library_verbosity)

    def play(self, episodes: list[Episode], seed: int, on_done: Callable[[int], None]) -> list[Trajectory]:
        size, extra = divmod(len(episodes), self.workers)
        starts = [index * size + min(index, extra) for index in range(self.workers + 1)]
        shares = [(starts[i], starts[i + 1]) for i in range(self.workers) if starts[i + 1] > starts[i]]
        context = mp.get_context("spawn")  # torch's threads do not survive a fork
        messages = context.Queue()
        processes = [context.Process(target=_play_share, daemon=True,
                                     args=(messages, index, self, episodes[start:end], seed + start, torch.get_num_threads()))
                     for index, (start, end) in enumerate(shares)]
        for process in processes:
            process.start()
        played: dict[int, list[Trajectory]] = {}
        try:
            while len(played) < len(processes):
                try:
                    kind, index, payload = messages.get(timeout=5)
                except queue.Empty:
                    lost = [i for i, process in enumerate(processes) if i not in played and not process.is_alive()]
                    if lost:
                        raise RuntimeError(f"evaluation worker {lost[0]} exited with code {processes[lost[0]].exitcode} "
                                           "before returning its episodes") from None
                    continue
                if kind == "done":
                    on_done(payload)
                elif kind == "error":
                    if isinstance(payload, UserError):
                        raise payload
                    raise RuntimeError(f"evaluation worker {index} failed: {payload!r}") from payload
                else:
                    played[index] = payload
        finally:
            for process in processes:
                if process.is_alive():
                    process.terminate()
                process.join()
        return [trajectory for index in range(len(processes)) for trajectory in played[index]]


def sized_load(load: LoadOptions | None, env: TextEnv, sampling: SamplingParams, max_turns: int | None,
               chat_history: bool) -> LoadOptions:
    """``load`` (default: auto device and dtype, hf) for playing ``env``: a vllm engine's
    default max_model_len is the longest sequence these rollouts sample."""
    turns = max_turns or env.max_turns
    return (load or LoadOptions()).sampling_up_to(sampled_tokens_bound(sampling.max_new_tokens, turns, chat_history))


def sharded_player(model: str, env: str, env_kwargs: dict, sampling: SamplingParams, max_turns: int | None,
                   workers: int, parallel_envs: int, constrain: bool = False, chat_history: bool = False,
                   load: LoadOptions | None = None) -> ShardedModelPlayer:
    """A :class:`ShardedModelPlayer` of ``model`` (a name, folder or run folder). Resolved
    here, once: a bad name fails in this process, and a model built or converted on first
    use is not built by every worker at once."""
    folder = str(resolve_model(model_source(model)))
    return ShardedModelPlayer(folder, env, env_kwargs, sampling, max_turns, workers, parallel_envs, model, constrain,
                              chat_history, load or LoadOptions())


def _play_share(messages: mp.Queue, index: int, player: ShardedModelPlayer, episodes: list[Episode], seed: int,
                threads: int) -> None:
    """One :class:`ShardedModelPlayer` worker: load the model, play ``episodes``, send them back."""
    torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    verbosity, progress_bars = player.library_verbosity
    hf_logging.set_verbosity(verbosity)
    if not progress_bars:
        hf_logging.disable_progress_bar()
    try:
        policy = player.load.load(player.model)
        with ExitStack() as stack:
            envs = [stack.enter_context(closing(make(player.env_name, **player.env_kwargs)))
                    for _ in range(min(player.parallel_envs, len(episodes)))]
            model_player = ModelPlayer(policy, envs, player.env_name, player.sampling, player.max_turns, player.label,
                                       player.constrain, player.chat_history)
            trajectories = model_player.play(episodes, seed, lambda n: messages.put(("done", index, n)))
        messages.put(("result", index, trajectories))
    except Exception as error:  # the parent raises it, naming the worker
        messages.put(("error", index, error))


@dataclass
class ScriptedPlayer:
    """An actor that needs no model (a scripted ALFWorld policy), on its own env pool."""

    actor: Actor
    pool: EnvPool
    env_name: str
    label: str
    chat_history: bool = False

    def play(self, episodes: list[Episode], seed: int, on_done: Callable[[int], None]) -> list[Trajectory]:
        return play(self.actor, self.pool, self.env_name, episodes, seed=seed, chat_history=self.chat_history,
                    on_wave=lambda wave: on_done(len(wave)))


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
    constrain: bool = False,
    chat_history: bool = False,
    load: LoadOptions | None = None,
) -> EvalResult:
    """Play every task of a split ``samples`` times in a fixed order and score it.

    ``split`` defaults to the env's held-out ``eval_split`` (ALFWorld ``id``, math and
    code ``test``). ``scripted`` names a scripted ALFWorld policy (walkthrough, expert,
    random): no model is loaded and ``model``/``policy``/``sampling`` are ignored; it plays
    in ``workers`` processes. A model named by ``model`` plays in ``workers`` processes too,
    each a contiguous share of the episodes (:class:`ShardedModelPlayer`). Episode ``i`` (task-major order) is seeded ``seed + i``
    either way. ``max_turns`` caps a model's episode below the env's own step limit.
    ``constrain``: a model's responses are restricted to the env's admissible actions, as
    ``rollout.constrain_to_admissible`` restricts training's. ``chat_history``: prompt with
    the whole conversation, as ``rollout.chat_history`` does (pair with ALFWorld's
    ``prompt_mode="chat"``). ``load``: device, dtype and backend of a model named by
    ``model`` (default: auto device and dtype, the hf backend).
    """
    if samples < 1:
        raise UserValueError(f"samples must be >= 1, got {samples}")
    env, kwargs = split_env_spec(env, dict(env_kwargs or {}))
    factory = env_factory(env)
    split = split or kwargs.get("split") or getattr(factory, "eval_split", None)
    if split is not None:
        kwargs["split"] = split
    limit_argument = getattr(factory, "limit_argument", None)
    if limit and limit_argument:
        kwargs.setdefault(limit_argument, limit)  # the same prefix as task_ids()[:limit], and no more prepared
    with ExitStack() as stack:
        first: TextEnv | EnvPool
        if scripted is not None:
            from hp_agent.scripted_play import ScriptedActor, scripted_pool

            actor = ScriptedActor(scripted)  # a bad name fails before any env is built
            first = stack.enter_context(scripted_pool(actor, env, kwargs, workers))
            player: Player = ScriptedPlayer(actor, first, env, f"scripted:{scripted}", chat_history)
        elif workers > 1:
            if policy is not None:
                raise UserValueError(f"workers={workers} loads the model in each worker process: name it with "
                                     "model= (a name or folder), not policy=")
            first = stack.enter_context(closing(make(env, **kwargs)))
            sampling = sampling or SamplingParams()
            player = sharded_player(str(model or "tiny"), env, kwargs, sampling, max_turns, workers, parallel_envs,
                                    constrain, chat_history, sized_load(load, first, sampling, max_turns, chat_history))
        else:
            label = type(policy).__name__ if policy is not None else str(model or "tiny")
            first, sampling = stack.enter_context(closing(make(env, **kwargs))), sampling or SamplingParams()
            if policy is None:  # after one env: its turn limit sizes a vllm engine
                policy = sized_load(load, first, sampling, max_turns, chat_history).load(model or "tiny")
            envs = [first] + [stack.enter_context(closing(make(env, **kwargs))) for _ in range(parallel_envs - 1)]
            player = ModelPlayer(policy, envs, env, sampling, max_turns, label, constrain, chat_history)
        task_ids = first.task_ids()[:limit] if limit else first.task_ids()
        episodes = [Episode(task_id, group=g) for g, task_id in enumerate(task_ids) for _ in range(samples)]
        with LoopProgress(f"eval {env}/{split} ({player.label})", len(episodes), enabled=progress, every=10) as bar:
            trajectories = player.play(episodes, seed, bar.advance)
    result = score(trajectories, env, str(split), samples, policy=player.label,
                   task_type_order=getattr(factory, "task_type_order", ()))
    if output is not None:
        atomic_write_text(Path(output), result.to_json())
    return result


# Training env kwargs that pick the training sample, shorten its episodes or shape its
# reward: evaluation plays the full held-out split under the env's own step limit and rewards.
TRAINING_ONLY_KWARGS = ("split", "num_games", "task_types", "max_steps", "subgoal_reward")


@dataclass(frozen=True)
class RunPlay:
    """How a run's rollouts played, which its evaluation repeats unless told otherwise: a
    restricted policy judged on free decoding, or a chat-history one on single prompts,
    would be judged on a game it never trained at."""

    max_new_tokens: int
    temperature: float
    constrain: bool
    chat_history: bool
    enable_thinking: bool
    env_kwargs: dict[str, Any]  # the training env's kwargs that define the game (source, prompt mode)

    @classmethod
    def of(cls, config: TrainConfig) -> RunPlay:
        rollout = config.rollout
        game = {key: value for key, value in config.env.kwargs.items() if key not in TRAINING_ONLY_KWARGS}
        return cls(rollout.max_new_tokens, rollout.temperature, rollout.constrain_to_admissible, rollout.chat_history,
                   config.model.enable_thinking, game)


def run_config_of(model: str) -> TrainConfig | None:
    """The config a run trained with, where ``model`` names a run folder or one of its
    checkpoints' model folders (``RUN/checkpoints/step_N/model``); else None."""
    from hp_agent.config import load_config

    path = Path(model)
    runs = [path] + ([path.parents[2]] if len(path.parents) > 2 and path.parent.parent.name == "checkpoints" else [])
    for run in runs:
        if (run / "config.yaml").is_file() and (run / "checkpoints").is_dir():
            return load_config(run / "config.yaml", cuda=False)  # devices are this command's, not the run's
    return None
