"""Reference solutions as real functions, and the problems built from them.

A reference is a module-level function whose docstring is its statement (a
``str.format`` template over the family's parameters) and whose keyword-only parameters
are the values a draw fixes (a divisor, a letter). The program a task ships is the
function's own source, each use of a parameter replaced by the value's ``repr``: so the
reference a linter checks is the program the tests are computed from.

A functional reference's positional parameters are the starter code's; a stdin
reference's positional parameters are the values its family's input-reading lines bind
(the program is those lines, then the function's body).
"""

from __future__ import annotations

import ast
import functools
import inspect
import io
import random
import textwrap
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hp_agent.envs.generated import Problem

TESTS_PER_PROBLEM = 6
LETTERS = "abcdefghijklmnopqrstuvwxyz"
COMMON = "aabcdeeilnorst"  # inputs drawn mostly from few letters, so letter-specific problems bite

Reference = Callable[..., Any]


def word(rng: random.Random, low: int = 0, high: int = 10, letters: str = COMMON) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(low, high)))


def numbers(rng: random.Random, low: int = -20, high: int = 50, longest: int = 9) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(0, longest))]


@dataclass(frozen=True)
class _Template:
    """A reference function, parsed once.

    statement: the docstring with its white space folded (a ``str.format`` template).
    signature: the positional parameters and the return annotation, as source text:
               ``(s: str) -> str``.
    body:      the body's source lines (after the docstring), indented as in the module.
    holes:     (line in body, start column, end column, parameter) of each parameter use.
    """

    statement: str
    signature: str
    body: tuple[str, ...]
    holes: tuple[tuple[int, int, int, str], ...]


@functools.cache
def _template(reference: Reference) -> _Template:
    source = inspect.getsource(reference)
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.FunctionDef) or ast.get_docstring(node) is None or len(node.body) < 2:
        raise ValueError(f"reference {reference.__name__} must be a function with a docstring (its statement) "
                         "and a body")
    first = node.body[1].lineno  # 1-based line of the body's first statement, after the docstring
    parameters = {argument.arg for argument in node.args.kwonlyargs}
    holes, previous = [], ""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        # An attribute (`s.upper`) is never a parameter, whatever its name.
        if token.type == tokenize.NAME and token.string in parameters and previous != "." and token.start[0] >= first:
            holes.append((token.start[0] - first, token.start[1], token.end[1], token.string))
        previous = token.string
    # The starter code's parameters: the positional ones, annotations and all.
    positional = ast.arguments(posonlyargs=[], args=node.args.args, kwonlyargs=[], kw_defaults=[], defaults=[])
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return _Template(" ".join(ast.get_docstring(node).split()), f"({ast.unparse(positional)}){returns}",
                     tuple(source.splitlines(keepends=True)[first - 1:]), tuple(holes))


def _body(template: _Template, params: dict[str, Any]) -> str:
    """The body's source with each parameter use replaced by the value's repr."""
    lines = list(template.body)
    for line, start, end, name in reversed(template.holes):  # right to left keeps the columns valid
        lines[line] = lines[line][:start] + repr(params[name]) + lines[line][end:]
    return "".join(lines)


def functional_problem(name: str, reference: Reference, inputs: Sequence[Any], **params: Any) -> Problem:
    """A problem whose tests call ``name`` (the reference renamed) on each argument list of ``inputs``."""
    template = _template(reference)
    starter = f"def {name}{template.signature}:"
    return Problem(template.statement.format(**params), f"{starter}\n{_body(template, params)}", inputs=inputs,
                   starter=starter)


def stdin_problem(head: str, read: str, reference: Reference, inputs: Sequence[str], **params: Any) -> Problem:
    """A problem whose program is ``read`` (the family's input-reading lines) then the reference's body.

    head: the statement's opening, which describes the input.
    """
    template = _template(reference)
    program = read + textwrap.dedent(_body(template, params))
    return Problem(head + template.statement.format(**params), program.strip() + "\n", inputs=inputs)
