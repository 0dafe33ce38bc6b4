"""Code tasks from a JSONL file in LiveCodeBench's layout (code_generation_lite).

One JSON object per line:

* ``question_content`` (required): the problem statement, examples included.
* ``public_test_cases`` / ``private_test_cases`` (required): a JSON string (or a list) of
  ``{"input", "output", "testtype"}`` with testtype ``functional`` or ``stdin``; one
  testtype per problem; at least one test in all. Public tests are named in feedback.
* ``metadata`` (functional problems): a JSON string (or object) with ``func_name``.
* ``starter_code`` (optional): shown in the prompt, e.g. a ``class Solution`` stub.
* ``question_id`` (optional): the task id; default ``<file stem>-<line>``.
* ``difficulty`` (optional): easy / medium / hard, the task type (difficulty 1 / 2 / 3).
* ``question_title``, ``platform``, ``contest_id``, ``contest_date`` (optional, unused).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hp_agent.envs.code.tasks import CodeTask, format_question
from hp_agent.envs.task_files import check_record_keys, read_task_file
from hp_agent.errors import UserValueError
from hp_agent.verifiers.code import TEST_KINDS, TestCase, parse_arguments

_REQUIRED_KEYS = ("question_content", "public_test_cases", "private_test_cases")
_OPTIONAL_KEYS = ("metadata", "starter_code", "question_id", "difficulty", "question_title", "platform", "contest_id",
                  "contest_date")
_VALID_KEYS = f"required keys: {', '.join(_REQUIRED_KEYS)}; optional keys: {', '.join(_OPTIONAL_KEYS)}"
_DIFFICULTIES = {"easy": 1, "medium": 2, "hard": 3}


def _decode(value: Any, key: str, where: str, expected: type) -> Any:
    """A field that LiveCodeBench stores as a JSON string (or already decoded)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            hint = (" (LiveCodeBench's released private tests are base64 + zlib + pickle: decode them with its own "
                    "loader first; pickles are never loaded here)" if key == "private_test_cases" else "")
            raise UserValueError(f"{where}: bad value for key {key!r}: not valid JSON ({err.msg}){hint}") from err
    if not isinstance(value, expected):
        raise UserValueError(f"{where}: bad value for key {key!r}: expected a JSON {expected.__name__}, "
                             f"got {type(value).__name__}")
    return value


def _tests(record: dict, key: str, where: str, public: bool) -> list[tuple[TestCase, str]]:
    """(test, testtype) pairs of one test list, each checked."""
    tests = []
    for number, case in enumerate(_decode(record[key], key, where, list), start=1):
        bad = f"{where}: bad value for key {key!r}: test {number}"
        if not isinstance(case, dict) or not {"input", "output", "testtype"} <= set(case):
            raise UserValueError(f"{bad} must be an object with input, output and testtype")
        if not isinstance(case["input"], str) or not isinstance(case["output"], str):
            raise UserValueError(f"{bad}: input and output must be strings")
        if case["testtype"] not in TEST_KINDS:
            raise UserValueError(f"{bad} has testtype {case['testtype']!r}; valid testtypes: {', '.join(TEST_KINDS)}")
        tests.append((TestCase(case["input"], case["output"], public), case["testtype"]))
    return tests


def _check_functional(tests: tuple[TestCase, ...], where: str) -> None:
    for number, test in enumerate(tests, start=1):
        try:
            parse_arguments(test.input)
            json.loads(test.output)
        except json.JSONDecodeError as err:
            raise UserValueError(f"{where}: functional test {number} (public first) is not JSON: {err.msg}; inputs hold "
                                 "one JSON value per line, outputs one JSON value") from err


def _task_from_record(record: Any, where: str, default_id: str) -> CodeTask:
    """Validate one parsed JSONL line; ``where`` is ``"path:line"`` for error messages."""
    record = check_record_keys(record, where, _REQUIRED_KEYS, _OPTIONAL_KEYS, _VALID_KEYS)
    for key in ("question_content", "starter_code", "difficulty"):
        if not isinstance(record.get(key, ""), str) or (key == "question_content" and not record[key].strip()):
            raise UserValueError(f"{where}: bad value for key {key!r}: {record.get(key)!r}; expected a non-empty string")
    pairs = _tests(record, "public_test_cases", where, True) + _tests(record, "private_test_cases", where, False)
    if not pairs:
        raise UserValueError(f"{where}: no tests: public_test_cases and private_test_cases are both empty")
    kinds = sorted({kind for _, kind in pairs})
    if len(kinds) > 1:
        raise UserValueError(f"{where}: tests mix testtypes {kinds}; a problem has one testtype")
    kind, tests = kinds[0], tuple(test for test, _ in pairs)
    func_name = None
    if kind == "functional":
        func_name = _decode(record.get("metadata", "{}"), "metadata", where, dict).get("func_name")
        if not isinstance(func_name, str) or not func_name.isidentifier():
            raise UserValueError(f"{where}: bad value for key 'metadata': functional tests need "
                                 f"{{\"func_name\": <identifier>}}, got func_name {func_name!r}")
        _check_functional(tests, where)
    task_id = str(record.get("question_id", default_id))
    difficulty = record.get("difficulty", "")
    question = format_question(record["question_content"], kind, record.get("starter_code", ""))
    return CodeTask(task_id, question, kind, tests, func_name, difficulty or "jsonl", _DIFFICULTIES.get(difficulty, 0))


def load_jsonl_tasks(path: str | Path) -> list[CodeTask]:
    """Tasks from a LiveCodeBench-layout JSONL file (see the module doc).

    Blank lines are skipped; duplicate ids, unknown keys and bad values are errors that
    name the file, the line and the key.
    """
    path = Path(path)
    return read_task_file(path, lambda record, where, lineno: _task_from_record(record, where, f"{path.stem}-{lineno}"),
                          _VALID_KEYS)
