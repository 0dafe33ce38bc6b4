"""Code verifier: run the response's program on a task's tests in the sandbox.

Reward R = 1.0 if every test passes, else 0.0. Tests come in LiveCodeBench's two kinds:

* ``functional``: the input holds the arguments, one JSON value per line; the output is
  the return value as JSON. The program defines ``func_name`` (or a class ``Solution``
  with that method). Return values compare after JSON's view of them (tuples are lists).
* ``stdin``: the input is fed as stdin; the output is the expected stdout. Compared line
  by line and token by token (runs of spaces and surrounding blank lines do not matter).

The program is the last fenced ```` ```python ```` (or plain ```` ``` ````) block of the
response. Feedback names the failed *public* tests (numbered as the examples shown in
the prompt) and why; of the private tests only how many failed. It never holds a private
test's expected output nor a reference solution.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from hp_agent.verifiers import Verdict
from hp_agent.verifiers.sandbox import SandboxLimits, SandboxRun, run_in_sandbox

NO_CODE_FEEDBACK = "no code block found (expected the program in a ```python ... ``` block)"
TEST_KINDS = ("functional", "stdin")
_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "python3", "py")
_SHOWN_CHARS = 60
_LISTED_FAILURES = 5


@dataclass(frozen=True)
class TestCase:
    """One test in LiveCodeBench's layout: ``input`` and ``output`` texts (see module doc).
    ``public`` tests are shown in the prompt and named in feedback."""

    __test__ = False  # not a pytest class

    input: str
    output: str
    public: bool = False


class CodeTests(Protocol):
    """What the verifier needs of a task."""

    @property
    def kind(self) -> str: ...  # "functional" or "stdin"

    @property
    def func_name(self) -> str | None: ...  # functional tests only

    @property
    def tests(self) -> tuple[TestCase, ...]: ...


@dataclass(frozen=True)
class TestOutcome:
    """One test's result; ``reason`` says why it failed (empty when it passed)."""

    passed: bool
    reason: str = ""


@dataclass(frozen=True)
class CodeResult:
    """A checked program: the verdict, each test's outcome, the sandbox's wall time."""

    verdict: Verdict
    outcomes: tuple[TestOutcome, ...]
    elapsed_s: float = 0.0

    @property
    def fraction_passed(self) -> float:
        return sum(o.passed for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0


def extract_program(response: str) -> str | None:
    """The last complete ```` ```python ```` / ```` ``` ```` block of ``response``, else None.

    Blocks tagged with another language are skipped; an unclosed block (a truncated
    response) is not a program.
    """
    programs = [match.group(2) for match in _FENCE.finditer(response)
                if match.group(1).strip().lower() in _PYTHON_TAGS]
    return programs[-1] if programs else None


def parse_arguments(text: str) -> list[Any]:
    """A functional test's arguments: one JSON value per non-empty line."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _as_json(value: Any) -> Any:
    """``value`` as a JSON round trip would give it back: tuples become lists."""
    if isinstance(value, (list, tuple)):
        return [_as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_json(item) for key, item in value.items()}
    return value


def _stdout_tokens(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def _shown(text: str) -> str:
    """A program's output as quoted in feedback: repr of at most ~60 characters."""
    return repr(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "...")


def _judge(test: TestCase, kind: str, claim: tuple[str, str] | None, ending: str) -> TestOutcome:
    """Compare the sandbox's claim for one test with the expected output."""
    if claim is None:
        return TestOutcome(False, ending)
    status, payload = claim
    if status == "error":
        return TestOutcome(False, payload)
    if kind == "stdin":
        if _stdout_tokens(payload) == _stdout_tokens(test.output):
            return TestOutcome(True)
        return TestOutcome(False, f"wrong output, got {_shown(payload)}")
    try:
        value = ast.literal_eval(payload)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return TestOutcome(False, f"returned a value that is not plain data: {_shown(payload)}")
    if _as_json(value) == json.loads(test.output):
        return TestOutcome(True)
    return TestOutcome(False, f"wrong return value, got {_shown(payload)}")


def _feedback(tests: Sequence[TestCase], outcomes: Sequence[TestOutcome]) -> str:
    failed = sum(not o.passed for o in outcomes)
    if not failed:
        return f"passed all {len(tests)} tests"
    lines = [f"failed {failed} of {len(tests)} tests"]
    public = [o for test, o in zip(tests, outcomes, strict=True) if test.public]
    public_failures = [f"public test {number}: {o.reason}" for number, o in enumerate(public, start=1) if not o.passed]
    lines += [failure[:160] for failure in public_failures[:_LISTED_FAILURES]]
    if len(public_failures) > _LISTED_FAILURES:
        lines.append(f"... and {len(public_failures) - _LISTED_FAILURES} more public tests")
    private = [o for test, o in zip(tests, outcomes, strict=True) if not test.public]
    if private:
        lines.append(f"private tests: {sum(not o.passed for o in private)} of {len(private)} failed")
    return "; ".join(lines)


def _inputs(task: CodeTests) -> list:
    if task.kind == "functional":
        return [parse_arguments(test.input) for test in task.tests]
    return [test.input for test in task.tests]


def judge_run(task: CodeTests, run: SandboxRun, limits: SandboxLimits) -> CodeResult:
    """Score a sandbox run of ``task``'s tests (outputs compared here, outside the sandbox)."""
    # Only the first test without an output was hit by how the run ended.
    first_missing = next((i for i in range(len(task.tests)) if i not in run.outputs), None)
    outcomes = []
    for index, test in enumerate(task.tests):
        reason = run.ending(limits) if index == first_missing else "not run (an earlier test ended the program)"
        outcomes.append(_judge(test, task.kind, run.outputs.get(index), reason))
    success = all(o.passed for o in outcomes)
    verdict = Verdict(reward=1.0 if success else 0.0, feedback=_feedback(task.tests, outcomes), success=success)
    return CodeResult(verdict, tuple(outcomes), run.elapsed_s)


def verify_program(program: str, task: CodeTests, limits: SandboxLimits | None = None) -> CodeResult:
    """Run ``program`` on every test of ``task`` in the sandbox and score it."""
    limits = limits or SandboxLimits()
    run = run_in_sandbox(program, task.kind, _inputs(task), task.func_name, limits)
    return judge_run(task, run, limits)


def verify_batch(programs: Sequence[str], tasks: Sequence[CodeTests], workers: int = 1,
                 limits: SandboxLimits | None = None) -> list[CodeResult]:
    """Check ``programs[i]`` against ``tasks[i]``, ``workers`` sandboxes at a time.

    Threads suffice: each check waits on its own child process.
    """
    if len(programs) != len(tasks):
        raise ValueError(f"got {len(programs)} programs for {len(tasks)} tasks; pass one program per task")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(programs) <= 1:
        return [verify_program(program, task, limits) for program, task in zip(programs, tasks, strict=True)]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code-verify") as pool:
        return list(pool.map(lambda pair: verify_program(*pair, limits), zip(programs, tasks, strict=True)))


def verify_code(response: str, task: CodeTests, limits: SandboxLimits | None = None) -> CodeResult:
    """Extract the program from a model ``response`` and check it; no code block gives R = 0."""
    program = extract_program(response)
    if program is None:
        return CodeResult(Verdict(reward=0.0, feedback=NO_CODE_FEEDBACK, success=False), ())
    return verify_program(program, task, limits)
