"""Math tasks from a JSONL file: one ``{"id", "question", "answer"}`` object per line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hp_agent.envs.math.tasks import MathTask
from hp_agent.envs.task_files import check_record_keys, read_task_file
from hp_agent.errors import UserValueError

_REQUIRED_KEYS = ("id", "question", "answer")
_OPTIONAL_KEYS = {"task_type": "jsonl", "difficulty": 0}
# JSON numbers are fine as ids and answers (`"answer": 42`); booleans never are.
_KEY_TYPES = {
    "id": (str, int), "question": (str,), "answer": (str, int, float), "task_type": (str,), "difficulty": (int,)
}
_VALID_KEYS = (f"required keys: {', '.join(_REQUIRED_KEYS)}; optional keys: "
               f"{', '.join(f'{k} (default {v!r})' for k, v in _OPTIONAL_KEYS.items())}")


def _task_from_record(record: Any, where: str) -> MathTask:
    """Validate one parsed JSONL line; ``where`` is ``"path:line"`` for error messages."""
    record = check_record_keys(record, where, _REQUIRED_KEYS, _OPTIONAL_KEYS, _VALID_KEYS)
    values = {**_OPTIONAL_KEYS, **record}
    for key, types in _KEY_TYPES.items():
        value = values[key]
        empty = key in _REQUIRED_KEYS and not str(value).strip()
        if isinstance(value, bool) or not isinstance(value, types) or empty:
            raise UserValueError(f"{where}: bad value for key {key!r}: {value!r}; {_VALID_KEYS}")
    return MathTask(
        str(values["id"]), values["question"], str(values["answer"]), values["task_type"], values["difficulty"]
    )


def load_jsonl_tasks(path: str | Path) -> list[MathTask]:
    """Tasks from a JSONL file: one ``{"id", "question", "answer"}`` object per line.

    Optional keys: ``task_type`` (default ``"jsonl"``) and ``difficulty`` (default 0).
    Blank lines are skipped; duplicate ids, unknown keys and bad values are errors that
    name the file and line.
    """
    return read_task_file(path, lambda record, where, _lineno: _task_from_record(record, where), _VALID_KEYS)
