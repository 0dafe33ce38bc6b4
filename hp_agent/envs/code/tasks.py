"""Code tasks: generated problems with tests (built-in splits) and their prompts.

A generated problem's split depends on its statement alone (examples excluded; see
:mod:`hp_agent.envs.generated`). Expected outputs come from running the reference
solution here, in-process: it is our own code, and this is the only place a reference
solution runs outside a demonstration.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass

from hp_agent.envs.code.families import FAMILIES
from hp_agent.envs.generated import Problem, generate_tasks
from hp_agent.verifiers.code import TestCase, parse_arguments

DEFAULT_SIZES = {"train": 1000, "test": 200}
PUBLIC_TESTS = 2  # the first tests of a generated problem; shown as examples in its prompt


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


def _func_name(problem: Problem) -> str | None:
    """The function a functional problem's tests call, named by its starter ``def`` line;
    None for a stdin problem (it has no starter code)."""
    return problem.starter.split()[1].split("(")[0] if problem.starter else None


def _examples(func_name: str | None, tests: list[TestCase]) -> str:
    """Public tests as examples: a call and its value, or an input and its output."""
    blocks = []
    for number, test in enumerate((t for t in tests if t.public), start=1):
        if func_name is not None:
            call = f"{func_name}({', '.join(map(repr, parse_arguments(test.input)))})"
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


def _expected_outputs(problem: Problem, func_name: str | None) -> list[str]:
    """Run the reference on every input: JSON return values (of ``func_name``), or stdout texts."""
    code = _compiled(problem.solution)
    if func_name is not None:
        namespace: dict = {}
        exec(code, namespace)
        function = namespace[func_name]
        return [json.dumps(function(*copy.deepcopy(args))) for args in problem.inputs]
    outputs = []
    for text in problem.inputs:
        stdout = _Stdout()
        exec(code, {"__name__": "__main__", "input": _Stdin(text), "print": stdout})
        outputs.append(stdout.text)
    return outputs


def _task(problem: Problem, task_id: str, family: str, level: int) -> CodeTask | None:
    """The task of ``problem``, or None when every test expects one output (a constant program would pass)."""
    func_name = _func_name(problem)
    if func_name is not None:
        inputs = ["\n".join(json.dumps(arg) for arg in args) for args in problem.inputs]
    else:
        inputs = list(problem.inputs)
    outputs = _expected_outputs(problem, func_name)
    if len(set(outputs)) < 2:
        return None
    tests = [TestCase(text, output, public=i < PUBLIC_TESTS)
             for i, (text, output) in enumerate(zip(inputs, outputs, strict=True))]
    kind = "stdin" if func_name is None else "functional"
    question = format_question(problem.statement, kind, problem.starter, _examples(func_name, tests))
    return CodeTask(task_id, question, kind, tuple(tests), func_name, family, level, problem.solution)


@functools.cache
def builtin_tasks(split: str, n: int, seed: int = 0) -> tuple[CodeTask, ...]:
    """The first ``n`` problems of ``split`` with distinct statements from the stream seeded by ``seed``.

    Draw i uses family ``i % 10`` at difficulty ``1 + (i // 10) % 3`` (see
    :func:`hp_agent.envs.generated.generate_tasks`). Cached: the evaluator builds one env
    per parallel slot.
    """
    return tuple(generate_tasks(split, n, seed, FAMILIES, _task))
