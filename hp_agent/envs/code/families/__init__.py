"""Families of small programming problems, each a seeded generator of statement, reference
program and test inputs (expected outputs are computed from the reference in
:mod:`hp_agent.envs.code.tasks`).

Five families are LeetCode-style functions (:mod:`.functional`), five read stdin and print
(:mod:`.stdin`). Within a family, level 1 is a one-line transform, level 2 needs a loop or
a condition, level 3 a few steps. Parameters (a divisor, a letter, a threshold) appear in
the statement, so one family yields many distinct problems. Reference solutions are real
functions (:mod:`.reference`).
"""

from hp_agent.envs.code.families.functional import FUNCTIONAL
from hp_agent.envs.code.families.reference import TESTS_PER_PROBLEM
from hp_agent.envs.code.families.stdin import STDIN
from hp_agent.envs.generated import Family

# Family (the task_type of generated tasks) -> generator(rng, level 1..3), in draw order.
FAMILIES: dict[str, Family] = {**FUNCTIONAL, **STDIN}

__all__ = ["FAMILIES", "TESTS_PER_PROBLEM"]
