"""Reading a user's task file: one JSON object per line, errors that name ``file:line``.

Shared by the single-step envs (math, code); each turns a record into its own task type.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hp_agent.errors import UserValueError


class _HasId(Protocol):
    id: str


TaskT = TypeVar("TaskT", bound=_HasId)


def read_task_file(path: str | Path, make_task: Callable[[dict, str, int], TaskT], valid_keys: str) -> list[TaskT]:
    """Tasks of a JSONL file, in file order; ``make_task(record, "file:line", line)`` builds one.

    Blank lines are skipped; invalid JSON, duplicate ids and an empty file are errors that
    name the file and line and repeat ``valid_keys`` (what a record may hold).
    """
    path = Path(path)
    tasks: list[TaskT] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserValueError(f"{where}: invalid JSON ({err.msg}); expected one object per line; {valid_keys}") from err
        task = make_task(record, where, lineno)
        if task.id in first_line:
            raise UserValueError(f"{where}: duplicate id {task.id!r} (first used on line {first_line[task.id]})")
        first_line[task.id] = lineno
        tasks.append(task)
    if not tasks:
        raise UserValueError(f"{path}: no tasks found; expected one JSON object per line with {valid_keys}")
    return tasks


def check_record_keys(record: Any, where: str, required: Collection[str], optional: Collection[str],
                      valid_keys: str) -> dict:
    """``record`` if it is an object with every ``required`` key and no key outside
    ``required`` and ``optional``; else an error naming ``where`` and the bad key."""
    if not isinstance(record, dict):
        raise UserValueError(f"{where}: expected a JSON object, got {type(record).__name__}; {valid_keys}")
    for key in required:
        if key not in record:
            raise UserValueError(f"{where}: missing key {key!r}; {valid_keys}")
    unknown = sorted(set(record) - set(required) - set(optional))
    if unknown:
        raise UserValueError(f"{where}: unknown key {unknown[0]!r}; {valid_keys}")
    return record
