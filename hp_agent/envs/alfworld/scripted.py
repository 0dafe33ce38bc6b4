"""Scripted ALFWorld policies for evaluation and sanity checks (no model involved).

* ``walkthrough``: replays the game's stored solution (translated to the names players
  see); wins every official ID and OOD game if the env is right.
* ``expert``: ALFWorld's handcoded expert (fixed for alfworld 0.4's ``move`` command),
  i.e. ``info["expert_action"]``.
* ``random``: uniform over the admissible actions shown in the prompt, seeded per episode.

Each answers ``<action>...</action>`` so its output goes through the same parsing as a
model's. :func:`play_episodes` drives any of them through the env API and returns
:class:`~hp_agent.trajectory.Trajectory` records (no token ids) that
:mod:`hp_agent.evaluation` scores like a model's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any, ClassVar

from hp_agent.envs.base import TextEnv
from hp_agent.errors import UserValueError
from hp_agent.trajectory import Trajectory, Turn

SCRIPTED_POLICIES: tuple[str, ...] = ("walkthrough", "expert", "random")
FALLBACK_ACTION = "look"  # what a policy plays when its script has nothing left to say


def as_response(command: str) -> str:
    """A command written the way the env parses actions."""
    return f"<action>{command}</action>"


class ScriptedPolicy:
    """A policy that answers from the env's state, not from a model."""

    name: ClassVar[str] = ""

    def start(self, env: TextEnv, info: dict[str, Any], seed: int) -> None:
        """Called after each reset with the reset's info."""

    def respond(self, observation: str, info: dict[str, Any]) -> str:
        """The response to ``observation`` (``info`` is the last reset/step info)."""
        raise NotImplementedError


class WalkthroughPolicy(ScriptedPolicy):
    """Replays the stored solution, then ``look`` if the game is somehow not won."""

    name = "walkthrough"

    def __init__(self) -> None:
        self._commands: list[str] = []

    def start(self, env: TextEnv, info: dict[str, Any], seed: int) -> None:
        walkthrough = getattr(env, "walkthrough", None)
        if walkthrough is None:
            raise TypeError(f"{type(env).__name__} has no walkthrough(); the walkthrough policy needs AlfworldEnv")
        self._commands = list(walkthrough())

    def respond(self, observation: str, info: dict[str, Any]) -> str:
        return as_response(self._commands.pop(0) if self._commands else FALLBACK_ACTION)


class ExpertPolicy(ScriptedPolicy):
    """Plays the env's ``info["expert_action"]`` (``look`` when the expert gave up)."""

    name = "expert"

    def respond(self, observation: str, info: dict[str, Any]) -> str:
        if "expert_action" not in info:
            raise KeyError("info has no 'expert_action'; the expert policy needs AlfworldEnv(expert=True)")
        return as_response(info["expert_action"] or FALLBACK_ACTION)


class RandomPolicy(ScriptedPolicy):
    """Uniform over ``info["admissible_actions"]``; each episode's draws depend on its seed only."""

    name = "random"

    def __init__(self) -> None:
        self._rng = random.Random(0)

    def start(self, env: TextEnv, info: dict[str, Any], seed: int) -> None:
        self._rng = random.Random(seed)

    def respond(self, observation: str, info: dict[str, Any]) -> str:
        actions = info.get("admissible_actions")
        if not actions:
            raise KeyError("info has no 'admissible_actions'; the random policy needs a multi-turn env")
        return as_response(self._rng.choice(actions))


_POLICIES: dict[str, Callable[[], ScriptedPolicy]] = {
    "walkthrough": WalkthroughPolicy,
    "expert": ExpertPolicy,
    "random": RandomPolicy,
}


def make_scripted(name: str) -> ScriptedPolicy:
    """A fresh scripted policy by name."""
    if name not in _POLICIES:
        raise UserValueError(f"unknown scripted policy {name!r}; valid: {', '.join(SCRIPTED_POLICIES)}")
    return _POLICIES[name]()


@dataclass(frozen=True)
class Job:
    """One episode to play: task, prompt group (for Avg@k / Pass@k) and seed."""

    task_id: str
    group: int
    seed: int


def play_episode(env: TextEnv, policy: ScriptedPolicy, job: Job, env_name: str = "alfworld") -> Trajectory:
    """Play one episode to its end (or ``env.max_turns`` steps) and record it."""
    observation, info = env.reset(seed=job.seed, options={"task_id": job.task_id})
    policy.start(env, info, job.seed)
    trajectory = Trajectory(env=env_name, task_id=info["task_id"], task_type=info.get("task_type", ""), group=job.group,
                            multi_turn=env.max_turns > 1)
    for _ in range(env.max_turns):
        response = policy.respond(observation, info)
        prompt = [{"role": "user", "content": observation}]
        observation, reward, terminated, truncated, info = env.step(response)
        trajectory.turns.append(Turn(prompt, [], [], [], response, action=str(info.get("action", response)),
                                     observation=str(info.get("game_text", observation)), reward=float(reward),
                                     shaping=float(info.get("shaping", 0.0)),
                                     invalid=bool(info.get("invalid_action", False))))
        verdict = info.get("verdict")
        if verdict is not None:
            trajectory.reward, trajectory.feedback, trajectory.success = verdict.reward, verdict.feedback, verdict.success
        if terminated or truncated:
            trajectory.truncated = truncated and not terminated
            return trajectory
    trajectory.truncated = True
    return trajectory


# Worker-process state: one env and one policy per process, built once.
_worker: dict[str, Any] = {}


def _init_worker(env_class: type[TextEnv], env_kwargs: dict[str, Any], policy_name: str, env_name: str) -> None:
    _worker.update(env=env_class(**env_kwargs), policy=make_scripted(policy_name), env_name=env_name)


def _play_in_worker(job: Job) -> Trajectory:
    return play_episode(_worker["env"], _worker["policy"], job, _worker["env_name"])


def play_episodes(env: TextEnv, env_kwargs: dict[str, Any], policy_name: str, jobs: Sequence[Job],
                  env_name: str = "alfworld", workers: int = 1,
                  on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Play ``jobs`` with scripted policy ``policy_name``, in order of ``jobs``.

    ``workers > 1`` plays in that many processes, each with its own
    ``type(env)(**env_kwargs)`` (a new game's translation is CPU-bound, 0.2-2 s). ``on_done`` is
    called with each finished trajectory (progress bars).
    """
    if workers < 1:
        raise UserValueError(f"workers must be >= 1, got {workers}")
    make_scripted(policy_name)  # fail on a bad name before starting processes
    if workers == 1 or len(jobs) <= 1:
        policy = make_scripted(policy_name)
        results = []
        for job in jobs:
            results.append(play_episode(env, policy, job, env_name))
            if on_done:
                on_done(results[-1])
        return results
    # spawn: a fresh interpreter per worker, so nothing of the parent (threads, torch) is forked.
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=(type(env), env_kwargs, policy_name, env_name)) as pool:
        results = []
        for trajectory in pool.map(_play_in_worker, jobs):
            results.append(trajectory)
            if on_done:
                on_done(trajectory)
        return results
