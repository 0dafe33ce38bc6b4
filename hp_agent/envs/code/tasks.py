"""Code tasks: generated problems with tests (built-in splits) and their prompts.

A generated problem's split depends on its statement alone (examples excluded):
``test`` iff ``int(sha1(statement)[:8]) % 5 == 0``, else ``train``. So the splits never
share a problem, whatever the seed or the sizes asked for. Expected outputs come from
running the reference solution here, in-process: it is our own code, and this is the
only place a reference solution runs outside a demonstration.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

from hp_agent.envs.code.families import FAMILIES, Problem
from hp_agent.verifiers.code import TestCase, parse_arguments

SPLITS = ("train", "test")
DEFAULT_SIZES = {"train": 1000, "test": 200}
PUBLIC_TESTS = 2  # the first tests of a generated problem; shown as examples in its prompt
_TEST_MODULUS = 5  # one statement in five lands in the test split


@dataclass(frozen=True)
class CodeTask:
    """One programming problem.

    question:     the prompt body: statement, examples, starter code or I/O note.
    kind:         "functional" or "stdin" (see :mod:`hp_agent.verifiers.code`).
    tests:        public tests first; every one must pass for reward 1.
    func_name:    the function (or ``Solution`` method) functional tests call.
    difficulty:   1 (one-liner) to 3 (several steps); 0 when unknown.
    solution:     the reference program (built-in tasks only): demonstrations and checks
                  of the generated tests; never shown in feedback.
    """

    id: str
    question: str
    kind: str
    tests: tuple[TestCase, ...]
    func_name: str | None
    task_type: str
    difficulty: int
    solution: str = ""


def split_of(statement: str) -> str:
    """The split a generated statement belongs to: ``test`` iff sha1(statement) % 5 == 0."""
    digest = hashlib.sha1(statement.encode("utf-8")).digest()
    return "test" if int.from_bytes(digest[:8], "big") % _TEST_MODULUS == 0 else "train"


def format_question(statement: str, kind: str, starter_code: str = "", examples: str = "") -> str:
    """The prompt body: the statement, then starter code (functional) or the stdin note."""
    parts = [statement.strip()]
    if examples:
        parts.append(examples)
    if starter_code.strip():
        parts.append(f"Complete this starter code:\n```python\n{starter_code.rstrip()}\n```")
    elif kind == "stdin":
        parts.append("Read the input from standard input and print the answer to standard output.")
    return "\n\n".join(parts)


def _examples(problem: Problem, tests: list[TestCase]) -> str:
    """Public tests as examples: a call and its value, or an input and its output."""
    blocks = []
    for number, test in enumerate((t for t in tests if t.public), start=1):
        if problem.kind == "functional":
            call = f"{problem.func_name}({', '.join(map(repr, parse_arguments(test.input)))})"
            blocks.append(f"Example {number}:\n{call} returns {json.loads(test.output)!r}")
        else:
            blocks.append(f"Example {number}:\nInput:\n{test.input.rstrip()}\nOutput:\n{test.output.rstrip()}")
    return "\n\n".join(blocks)


class _Stdin:
    """``input()`` over fixed lines, raising EOFError at the end like the builtin."""

    def __init__(self, text: str):
        self._lines: Iterator[str] = iter(text.splitlines())

    def __call__(self, prompt: str = "") -> str:
        try:
            return next(self._lines)
        except StopIteration:
            raise EOFError("EOF when reading a line") from None


class _Stdout:
    """``print()`` into a string (the references print plain values only)."""

    def __init__(self):
        self.text = ""

    def __call__(self, *values, sep: str = " ", end: str = "\n") -> None:
        self.text += sep.join(map(str, values)) + end


@functools.lru_cache(maxsize=4096)
def _compiled(solution: str):
    return compile(solution, "<reference>", "exec")


def _expected_outputs(problem: Problem) -> list[str]:
    """Run the reference on every input: JSON return values, or stdout texts."""
    code = _compiled(problem.solution)
    if problem.kind == "functional":
        namespace: dict = {}
        exec(code, namespace)
        function = namespace[problem.func_name]
        return [json.dumps(function(*copy.deepcopy(args))) for args in problem.inputs]
    outputs = []
    for text in problem.inputs:
        stdout = _Stdout()
        exec(code, {"__name__": "__main__", "input": _Stdin(text), "print": stdout})
        outputs.append(stdout.text)
    return outputs


def _task(problem: Problem, task_id: str, family: str, level: int) -> CodeTask:
    if problem.kind == "functional":
        inputs = ["\n".join(json.dumps(arg) for arg in args) for args in problem.inputs]
    else:
        inputs = list(problem.inputs)
    tests = [TestCase(text, output, public=i < PUBLIC_TESTS)
             for i, (text, output) in enumerate(zip(inputs, _expected_outputs(problem), strict=True))]
    question = format_question(problem.statement, problem.kind, problem.signature, _examples(problem, tests))
    return CodeTask(task_id, question, problem.kind, tuple(tests), problem.func_name, family, level, problem.solution)


@functools.cache
def builtin_tasks(split: str, n: int, seed: int = 0) -> tuple[CodeTask, ...]:
    """The first ``n`` problems of ``split`` with distinct statements from the stream seeded by ``seed``.

    Draw i uses family ``i % 10`` at difficulty ``1 + (i // 10) % 3``; the stream is the
    same for both splits, so a smaller ``n`` gives a prefix of a larger one. Cached: the
    evaluator builds one env per parallel slot.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if n < 0:
        raise ValueError(f"number of tasks must be >= 0, got {n}")
    rng = random.Random(seed)
    families = list(FAMILIES.items())
    seen: set[str] = set()
    tasks: list[CodeTask] = []
    # The cap only trips if the families run out of distinct statements.
    for draw in range(_TEST_MODULUS * 20 * n + 1000):
        if len(tasks) == n:
            break
        family, generate = families[draw % len(families)]
        level = 1 + (draw // len(families)) % 3
        problem = generate(rng, level)
        if problem.statement in seen or split_of(problem.statement) != split:
            continue
        task = _task(problem, f"gen-{split}-{len(tasks):05d}", family, level)
        if len({test.output for test in task.tests}) < 2:
            continue  # one output for every test: a constant program would pass
        seen.add(problem.statement)
        tasks.append(task)
    if len(tasks) < n:
        raise ValueError(f"could only generate {len(tasks)} distinct {split} problems, {n} were asked for")
    return tuple(tasks)
