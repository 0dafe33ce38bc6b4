"""Generated problems, shared by the built-in math and code tasks.

A family is a seeded generator ``(rng, level) -> Problem``. :func:`generate_tasks` draws
from all families of an env in turn and keeps the first ``n`` problems of one split with
distinct statements. A problem's split depends on its statement alone:
``test`` iff ``int(sha1(statement)[:8]) % 5 == 0``, else ``train``. So the splits never
share a statement, whatever the seed or the sizes asked for.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hp_agent.errors import UserValueError

SPLITS = ("train", "test")
_LEVELS = 3  # difficulty 1 (one step) to 3 (several steps)
_TEST_MODULUS = 5  # one statement in five lands in the test split
# A split gets a draw in _TEST_MODULUS on average; the 20x margin covers repeated
# statements and rejected problems, so the cap only trips when a family runs dry.
_DRAWS_PER_TASK = _TEST_MODULUS * 20
_SPARE_DRAWS = 1000

TaskT = TypeVar("TaskT")


@dataclass(frozen=True)
class Problem:
    """One generated problem, before it becomes a task.

    statement: the problem text; its split and its uniqueness are decided on it alone.
    solution:  the reference: a worked solution ending in ``\\boxed{answer}`` (math) or a
               program (code).
    answer:    math: the exact answer text.
    inputs:    code: one test input each: an argument list (functional problems) or a
               stdin text.
    starter:   code: a functional problem's ``def`` line, given as starter code; empty for
               a stdin problem.
    """

    statement: str
    solution: str
    answer: str = ""
    inputs: Sequence[Any] = ()
    starter: str = ""


Family = Callable[[random.Random, int], Problem]


def split_of(statement: str) -> str:
    """The split a generated statement belongs to: ``test`` iff sha1(statement) % 5 == 0."""
    digest = hashlib.sha1(statement.encode("utf-8")).digest()
    return "test" if int.from_bytes(digest[:8], "big") % _TEST_MODULUS == 0 else "train"


def generate_tasks(split: str, n: int, seed: int, families: Mapping[str, Family],
                   make_task: Callable[[Problem, str, str, int], TaskT | None]) -> list[TaskT]:
    """The first ``n`` tasks of ``split`` with distinct statements from the stream seeded by ``seed``.

    Draw i uses family ``i % len(families)`` at level ``1 + (i // len(families)) % 3``; the
    stream is the same for both splits, so a smaller ``n`` gives a prefix of a larger one.
    ``make_task(problem, task_id, family, level)`` builds a task, or returns None to reject
    the problem (its statement may come again with other inputs).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if n < 0:
        raise ValueError(f"number of tasks must be >= 0, got {n}")
    rng = random.Random(seed)
    named = list(families.items())
    seen: set[str] = set()
    tasks: list[TaskT] = []
    for draw in range(_DRAWS_PER_TASK * n + _SPARE_DRAWS):
        if len(tasks) == n:
            break
        family, generate = named[draw % len(named)]
        level = 1 + (draw // len(named)) % _LEVELS
        problem = generate(rng, level)
        if problem.statement in seen or split_of(problem.statement) != split:
            continue
        task = make_task(problem, f"gen-{split}-{len(tasks):05d}", family, level)
        if task is None:
            continue
        seen.add(problem.statement)
        tasks.append(task)
    if len(tasks) < n:
        raise UserValueError(f"could only generate {len(tasks)} distinct {split} problems, {n} were asked for")
    return tasks
