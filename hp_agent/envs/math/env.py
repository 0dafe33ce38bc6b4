"""Single-step math environment: the observation is a problem, the action a worked answer.

Reward R = 1.0 if the last ``\\boxed{...}`` in the action equals the reference answer
(checked by :func:`hp_agent.verifiers.math.verify_math`), else 0.0. One step per episode.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from hp_agent.envs.base import SingleStepTaskEnv
from hp_agent.envs.generated import SPLITS
from hp_agent.envs.math.jsonl import load_jsonl_tasks
from hp_agent.envs.math.tasks import DEFAULT_SIZES, MathTask, builtin_tasks
from hp_agent.verifiers.math import extract_boxed, verify_math


class MathEnv(SingleStepTaskEnv):
    """Math word problems, built-in (generated, ``split`` train/test) or from a JSONL file.

    split:     "train" or "test": which built-in split to generate (a label when ``data``
               is given).
    data:      path to a JSONL file of ``{"id", "question", "answer"}`` objects; replaces
               the built-in tasks.
    num_tasks: keep the first ``num_tasks`` tasks (built-in default: train 2000, test 200).
    seed:      seed of the built-in generator.
    """

    eval_samples: ClassVar[int] = 4  # Avg@4 and Pass@4, as the paper reports math

    system_prompt: ClassVar[str | None] = (
        "Solve the math problem. Reason step by step, then give the final answer as \\boxed{answer}."
    )
    answer_format: ClassVar[str | None] = r"\\boxed\{|\}"
    _tasks: dict[str, MathTask]

    def __init__(self, split: str = "train", data: str | Path | None = None, num_tasks: int | None = None,
                 seed: int = 0):
        super().__init__()
        self._check_options(split, SPLITS, num_tasks)
        if data is None:
            tasks = builtin_tasks(split, num_tasks or DEFAULT_SIZES[split], seed)
        else:
            tasks = load_jsonl_tasks(data)[:num_tasks]
        self._set_tasks(split, tasks)

    def reference_answer(self, task_id: str) -> str:
        """The reference answer of ``task_id`` (for evaluation and tests; never shown to the policy)."""
        return self.task(task_id).answer

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Grade ``action``; always terminates. The observation after the end is ``""``."""
        task = self._take_step()
        verdict = verify_math(action, task.answer)
        answer = extract_boxed(action)
        info = {
            "verdict": verdict,
            "action": answer if answer is not None else "",
            "invalid_action": answer is None,
            "shaping": 0.0,
            "task_id": task.id,
            "task_type": task.task_type,
        }
        return "", verdict.reward, True, False, info

    def demonstrations(self) -> Iterator[tuple[str, str]]:
        """Each task's question and worked solution (built-in tasks only: JSONL has none)."""
        for task in self._tasks.values():
            if task.solution:
                yield task.question, task.solution
