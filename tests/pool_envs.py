"""Envs for tests: ones that misbehave on purpose (tests/test_env_pool.py), and TiedOrNot.

They live in an importable module (not in the test file) so that worker processes can
build them from the spec ``"pool_envs:ScriptedEnv"``: pytest puts tests/ on ``sys.path``
and workers inherit it.
"""

import itertools
import os
import time

from gymnasium import spaces

from hp_agent.envs.base import TextEnv
from hp_agent.verifiers import Verdict

TASKS = ["ok-0", "ok-1", "ok-2", "ok-3", "raise", "exit", "hang", "two-steps", "raise-at-reset"]


class ScriptedEnv(TextEnv):
    """The task id says what ``step`` does: finish with reward 1 ("ok-*"), raise, call
    ``os._exit(1)``, sleep for 1000 s, or need two steps ("two-steps"); or that ``reset``
    raises ("raise-at-reset")."""

    system_prompt = "Say anything."
    max_turns = 3

    def __init__(self):  # small Text spaces: TextEnv's full-Unicode ones take ~0.5 s to build
        self.observation_space = self.action_space = spaces.Text(max_length=10_000)

    def task_ids(self):
        return list(TASKS)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.task = (options or {}).get("task_id") or self.task_id_for_seed(seed or 0)
        self.steps = 0
        if self.task == "raise-at-reset":
            raise RuntimeError("boom in reset")
        return f"task {self.task}", {"task_id": self.task, "task_type": self.task.split("-")[0]}

    def step(self, action):
        self.steps += 1
        if self.task == "raise":
            raise RuntimeError("boom in step")
        if self.task == "exit":
            os._exit(1)
        if self.task == "hang":
            time.sleep(1000)
        if self.task == "two-steps" and self.steps < 2:
            return "once more", 0.0, False, False, {"action": action}
        return "", 1.0, True, False, {"verdict": Verdict(1.0, "done", True), "action": action}


_built = itertools.count()


class GrowingTurnsEnv(ScriptedEnv):
    """Each instance built in a process allows one turn more than the one before (the
    first, one turn), and says so in its reset info: the envs of one pool differ in
    ``max_turns``, and env 0 allows the fewest, in this process or in a worker."""

    def __init__(self):
        super().__init__()
        self.max_turns = 1 + next(_built)

    def reset(self, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return observation, {**info, "max_turns": self.max_turns}


class TiedOrNot(TextEnv):
    """Task ``tied``: every episode wins. Task ``split``: an episode wins when its seed is
    odd, so the 4 consecutive seeds of a GRPO group give rewards 0, 1, 0, 1 (for the
    tests of GRPO's zero-gradient records and of data parallelism)."""

    def task_ids(self):
        return ["tied", "split"]

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.task, self.seed = options["task_id"], seed
        return f"Task {self.task}.", {"task_id": self.task, "task_type": self.task}

    def step(self, action):
        won = self.task == "tied" or self.seed % 2 == 1
        return "", float(won), True, False, {"verdict": Verdict(float(won), "", won)}


class SometimesBroken(ScriptedEnv):
    """Four tasks: two that finish, one whose ``step`` raises and one whose ``reset`` does
    (the trainer's errored-episode tests); ``max_turns`` 3: a multi-turn env."""

    def task_ids(self):
        return ["ok-0", "two-steps", "raise", "raise-at-reset"]


class SometimesBrokenSingleStep(SometimesBroken):
    """The same tasks in a single-step env ("two-steps" is then cut off after its one turn)."""

    max_turns = 1
