"""Math tasks: the task type, and the built-in splits drawn from :mod:`.generators`."""

from __future__ import annotations

from dataclasses import dataclass

from hp_agent.envs.generated import Problem, generate_tasks
from hp_agent.envs.math.generators import GENERATORS

DEFAULT_SIZES = {"train": 2000, "test": 200}


@dataclass(frozen=True)
class MathTask:
    """One problem.

    difficulty: 1 (small numbers, one or two steps) to 3 (bigger numbers, more steps);
                0 when unknown (user data).
    solution:   a worked solution ending in ``\\boxed{answer}``; built-in tasks only
                (empty for user data), used as tokenizer corpus text.
    """

    id: str
    question: str
    answer: str
    task_type: str
    difficulty: int
    solution: str = ""


def _task(problem: Problem, task_id: str, skill: str, level: int) -> MathTask:
    return MathTask(task_id, problem.statement, problem.answer, skill, level, problem.solution)


def builtin_tasks(split: str, n: int, seed: int = 0) -> list[MathTask]:
    """The first ``n`` unique generated problems of ``split`` from the stream seeded by ``seed``.

    Draw i uses skill ``i % 8`` at difficulty ``1 + (i // 8) % 3`` (see
    :func:`hp_agent.envs.generated.generate_tasks`).
    """
    return generate_tasks(split, n, seed, GENERATORS, _task)
