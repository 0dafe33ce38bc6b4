"""Single-step code environment: the observation is a problem, the action a Python program.

Reward R = 1.0 if the last ```` ```python ```` block of the action passes every test of the
task in the sandbox (checked by :func:`hp_agent.verifiers.code.verify_batch`), else 0.0.
One step per episode. ``info["tests_passed"]`` is the fraction of tests passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from hp_agent.envs.base import SingleStepTaskEnv
from hp_agent.envs.code.jsonl import load_jsonl_tasks
from hp_agent.envs.code.tasks import DEFAULT_SIZES, CodeTask, builtin_tasks
from hp_agent.envs.generated import SPLITS
from hp_agent.verifiers import Verdict
from hp_agent.verifiers.code import NO_CODE_FEEDBACK, CodeResult, extract_program, verify_batch
from hp_agent.verifiers.sandbox import SandboxLimits, sandbox_support


def demonstration(task: CodeTask) -> str:
    """The response a demonstration teaches: the reference program in a code block."""
    return f"```python\n{task.solution}```"


class CodeEnv(SingleStepTaskEnv):
    """Python programming problems, built-in (generated, ``split`` train/test) or from a
    LiveCodeBench-layout JSONL file (see :mod:`hp_agent.envs.code.jsonl`).

    split:         "train" or "test": which built-in split to generate (a label when
                   ``data`` is given).
    data:          path to a JSONL file; replaces the built-in tasks.
    num_tasks:     keep the first ``num_tasks`` tasks (built-in default: train 1000, test 200).
    seed:          seed of the built-in generator.
    timeout_s, cpu_time_s, memory_mb, max_processes: the sandbox's limits for one
                   program run over all of a task's tests (defaults: 4 s wall clock, 4 CPU
                   seconds, 512 MiB address space, 32 processes; see
                   :class:`~hp_agent.verifiers.sandbox.SandboxLimits`).
    """

    system_prompt: ClassVar[str | None] = (
        "Solve the programming problem in Python 3. Reply with the complete program in one ```python code block."
    )
    answer_format: ClassVar[str | None] = r"```(?:python|py)?"
    eval_samples: ClassVar[int] = 8  # Pass@1 (Avg@8) and Pass@8, as the paper reports code
    _tasks: dict[str, CodeTask]

    def __init__(self, split: str = "train", data: str | Path | None = None, num_tasks: int | None = None,
                 seed: int = 0, timeout_s: float = SandboxLimits.timeout_s, cpu_time_s: int = SandboxLimits.cpu_time_s,
                 memory_mb: int = SandboxLimits.memory_mb, max_processes: int = SandboxLimits.max_processes):
        super().__init__()
        self._check_options(split, SPLITS, num_tasks)
        self.limits = SandboxLimits(timeout_s=timeout_s, cpu_time_s=cpu_time_s, memory_mb=memory_mb,
                                    max_processes=max_processes)
        if data is None:
            tasks = builtin_tasks(split, num_tasks or DEFAULT_SIZES[split], seed)
        else:
            tasks = load_jsonl_tasks(data)[:num_tasks]
        sandbox_support(self.limits.python, self.limits.user)  # probe (and log) what the kernel allows, once
        self._set_tasks(split, tasks)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the action's program on the task's tests; always terminates. The observation after the end is ``""``."""
        task = self._take_step()
        program = extract_program(action)
        if program is None:
            result = CodeResult(Verdict(reward=0.0, feedback=NO_CODE_FEEDBACK, success=False), ())
        else:
            result = verify_batch([program], [task], workers=1, limits=self.limits)[0]
        info = {
            "action": program if program is not None else "",
            "invalid_action": program is None,
            "shaping": 0.0,
            "task_id": task.id,
            "task_type": task.task_type,
            "tests_passed": result.fraction_passed,
            "tests_total": len(task.tests),
            "verdict": result.verdict,
        }
        return "", result.verdict.reward, True, False, info

    def demonstrations(self) -> Iterator[tuple[str, str]]:
        """Each task's question and reference program in a code block (built-in tasks only: JSONL has none)."""
        for task in self._tasks.values():
            if task.solution:
                yield task.question, demonstration(task)
