"""Math env, task generator, JSONL loader and verifier."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

from hp_agent.envs import make
from hp_agent.envs.generated import split_of
from hp_agent.envs.math import MathEnv
from hp_agent.envs.math.generators import GENERATORS
from hp_agent.envs.math.jsonl import load_jsonl_tasks
from hp_agent.envs.math.tasks import MathTask, builtin_tasks
from hp_agent.verifiers.math import NO_ANSWER_FEEDBACK, extract_boxed, verify_math


@pytest.fixture(scope="module")
def train_tasks() -> list[MathTask]:
    return builtin_tasks("train", 2000)


@pytest.fixture(scope="module")
def test_tasks() -> list[MathTask]:
    return builtin_tasks("test", 200)


@pytest.fixture(scope="module")
def train_env() -> MathEnv:
    return MathEnv(split="train", num_tasks=50)


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---- generator -------------------------------------------------------------------


def test_generator_is_deterministic_and_fast() -> None:
    start = time.perf_counter()
    first = builtin_tasks("train", 2000, seed=3)
    assert time.perf_counter() - start < 0.5
    assert first == builtin_tasks("train", 2000, seed=3)
    assert builtin_tasks("train", 100, seed=3) == first[:100]
    assert [t.question for t in builtin_tasks("train", 50, seed=4)] != [t.question for t in first[:50]]


def test_ids_sizes_and_uniqueness(train_tasks: list[MathTask], test_tasks: list[MathTask]) -> None:
    assert len(train_tasks) == 2000 and len(test_tasks) == 200
    assert train_tasks[42].id == "gen-train-00042" and test_tasks[0].id == "gen-test-00000"
    for tasks in (train_tasks, test_tasks):
        assert len({t.id for t in tasks}) == len(tasks)
        assert len({t.question for t in tasks}) == len(tasks)


def test_splits_are_disjoint(train_tasks: list[MathTask], test_tasks: list[MathTask]) -> None:
    assert not {t.question for t in train_tasks} & {t.question for t in test_tasks}
    assert all(split_of(t.question) == "train" for t in train_tasks)
    assert all(split_of(t.question) == "test" for t in test_tasks)
    # A different seed draws other problems but never moves a question across splits.
    other_test = {t.question for t in builtin_tasks("test", 200, seed=1)}
    assert not other_test & {t.question for t in train_tasks}


def test_every_skill_and_level_in_both_splits(train_tasks: list[MathTask], test_tasks: list[MathTask]) -> None:
    assert len(GENERATORS) >= 6
    for tasks in (train_tasks, test_tasks):
        assert {t.task_type for t in tasks} == set(GENERATORS)
        assert {t.difficulty for t in tasks} == {1, 2, 3}


def test_builtin_answers_verify_against_themselves(train_tasks: list[MathTask], test_tasks: list[MathTask]) -> None:
    for task in train_tasks + test_tasks:
        assert verify_math(f"So the answer is \\boxed{{{task.answer}}}.", task.answer).reward == 1.0, task
        assert verify_math(task.solution, task.answer).reward == 1.0, task
        assert "\\boxed" not in task.question and task.answer in task.solution


def test_builtin_answers_are_exact_and_wrong_answers_fail(train_tasks: list[MathTask]) -> None:
    for task in train_tasks[:200]:
        assert "." not in task.answer  # integers or \frac{a}{b}, never decimals
        wrong = "\\frac{1}{7919}" if task.answer != "\\frac{1}{7919}" else "0"
        assert verify_math(f"\\boxed{{{wrong}}}", task.answer).reward == 0.0


def test_bad_split_and_size() -> None:
    with pytest.raises(ValueError, match=r"'dev'.*train, test"):
        builtin_tasks("dev", 10)
    with pytest.raises(ValueError, match=r"'dev'.*train, test"):
        MathEnv(split="dev")
    with pytest.raises(ValueError, match="num_tasks"):
        MathEnv(num_tasks=0)


# ---- verifier --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\fbox{ 7 }", " 7 "),
        ("\\boxed {\\sqrt{\\frac{a}{b}}}", "\\sqrt{\\frac{a}{b}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{\\boxed{3}}", "\\boxed{3}"),
        ("\\boxed{4} and a truncated \\boxed{5", "4"),
        ("no box here", None),
        ("\\boxed{12", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_verify_feedback() -> None:
    right = verify_math("Adding: \\boxed{42}", "42")
    assert (right.reward, right.success, right.feedback) == (1.0, True, "correct: final answer 42")
    wrong = verify_math("I think \\boxed{17}", "42")
    assert (wrong.reward, wrong.success, wrong.feedback) == (0.0, False, "incorrect: final answer 17")
    missing = verify_math("The answer is 42.", "42")
    assert (missing.reward, missing.feedback) == (0.0, NO_ANSWER_FEEDBACK)
    assert "\\boxed{" in missing.feedback


@pytest.mark.parametrize(
    "response",
    ["\\boxed{17}", "\\boxed{}", "\\boxed{\\frac{}{}}", "\\boxed{9^{9^{9^{9}}}}", "\\boxed{" + "(" * 5000 + "}",
     "no answer", "\\boxed{x^2 + y}", "\\boxed{\\text{many}}"],
)
def test_feedback_never_contains_reference(response: str) -> None:
    reference = "\\frac{314}{271}"
    verdict = verify_math(response, reference)
    assert verdict.reward == 0.0
    assert reference not in verdict.feedback and "314" not in verdict.feedback
    assert len(verdict.feedback) < 200


@pytest.mark.parametrize(
    ("answer", "reference"),
    [("0.5", "\\frac{1}{2}"), ("\\frac{1}{2}", "1/2"), ("2/4", "\\frac{1}{2}"), ("-\\frac{5}{2}", "-5/2"),
     ("-2.5", "-\\frac{5}{2}"), ("12", "12"), ("x = 12", "12"), ("\\dfrac{3}{4}", "3/4"), ("2^{2024}", "2^{2024}")],
)
def test_equivalent_forms_accepted(answer: str, reference: str) -> None:
    assert verify_math(f"\\boxed{{{answer}}}", reference).reward == 1.0


def test_unparsable_and_huge_answers_give_zero_without_raising() -> None:
    assert "could not be parsed" in verify_math("\\boxed{}", "3").feedback
    assert "could not be parsed" in verify_math("\\boxed{" + "1+" * 600 + "1}", "3").feedback
    start = time.perf_counter()
    huge = verify_math("\\boxed{9^{9^{9^{9}}}}", "3")
    assert (huge.reward, time.perf_counter() - start < 1.0) == (0.0, True)
    assert "too large" in huge.feedback


def test_verify_from_a_worker_thread() -> None:
    results = []

    def work() -> None:
        results.append(verify_math("\\boxed{\\frac{2}{4}}", "1/2"))
        results.append(verify_math("\\boxed{10^{10^{10}}}", "3"))

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert [v.reward for v in results] == [1.0, 0.0]


def test_unparsable_reference_is_an_error() -> None:
    with pytest.raises(ValueError, match="reference answer"):
        verify_math("\\boxed{1}", "")


# ---- JSONL loader ----------------------------------------------------------------


def test_load_jsonl_happy_path(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [
        json.dumps({"id": "a", "question": "What is 1 + 1?", "answer": "2"}),
        "",
        json.dumps({"id": 7, "question": "Half of 1?", "answer": 0.5, "task_type": "frac", "difficulty": 2}),
    ])
    tasks = load_jsonl_tasks(path)
    assert tasks == [MathTask("a", "What is 1 + 1?", "2", "jsonl", 0), MathTask("7", "Half of 1?", "0.5", "frac", 2)]


@pytest.mark.parametrize(
    ("lines", "pattern"),
    [
        (['{"id": "a", "question": "q", "answer": "1"}', '{"id": "b", "question": '], r":2: invalid JSON"),
        (['{"id": "a", "question": "q"}'], r":1: missing key 'answer'"),
        (['{"id": "a", "question": "q", "answer": "1", "anwser": "1"}'], r":1: unknown key 'anwser'"),
        (['{"id": "a", "question": "", "answer": "1"}'], r":1: bad value for key 'question'"),
        (['{"id": "a", "question": "q", "answer": true}'], r":1: bad value for key 'answer'"),
        (['["a", "q", "1"]'], r":1: expected a JSON object"),
        (['{"id": "a", "question": "q", "answer": "1"}', "", '{"id": "a", "question": "r", "answer": "2"}'],
         r":3: duplicate id 'a' \(first used on line 1\)"),
    ],
)
def test_load_jsonl_errors(tmp_path: Path, lines: list[str], pattern: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError, match=pattern) as error:
        load_jsonl_tasks(path)
    assert str(path) in str(error.value)
    if "duplicate" not in pattern:
        assert "required keys: id, question, answer" in str(error.value)


def test_load_jsonl_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no tasks"):
        load_jsonl_tasks(write_jsonl(tmp_path / "empty.jsonl", ["", "  "]))


# ---- env -------------------------------------------------------------------------


def test_make_math_defaults() -> None:
    env = make("math")
    assert isinstance(env, MathEnv)
    assert len(env.task_ids()) == 2000 and env.task_ids()[0] == "gen-train-00000"
    assert len(MathEnv(split="test").task_ids()) == 200
    assert env.reward_bounds == (0.0, 1.0) and env.max_turns == 1
    assert "\\boxed{" in (env.system_prompt or "")


def test_check_env_train(train_env: MathEnv) -> None:
    check_env(train_env, skip_render_check=True)


def test_check_env_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [
        json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}) for i in range(5)
    ])
    env = MathEnv(data=str(path), split="test")
    assert env.task_ids() == [f"q{i}" for i in range(5)]
    check_env(env, skip_render_check=True)
    obs, info = env.reset(options={"task_id": "q3"})
    assert obs == "What is 3 + 3?" and info == {"task_id": "q3", "task_type": "jsonl", "difficulty": 0}


def test_reset_and_step(train_env: MathEnv) -> None:
    task_id = train_env.task_ids()[7]
    obs, info = train_env.reset(options={"task_id": task_id})
    assert info["task_id"] == task_id and info["difficulty"] in (1, 2, 3)
    answer = train_env.reference_answer(task_id)
    obs2, reward, terminated, truncated, step_info = train_env.step(f"Work... \\boxed{{{answer}}}")
    assert (obs2, reward, terminated, truncated) == ("", 1.0, True, False)
    assert step_info["action"] == answer and step_info["invalid_action"] is False
    assert step_info["shaping"] == 0.0 and step_info["verdict"].success
    assert step_info["task_id"] == task_id and step_info["task_type"] == info["task_type"]
    with pytest.raises(RuntimeError, match="reset"):
        train_env.step("\\boxed{1}")

    train_env.reset(seed=3)
    _, reward, _, _, step_info = train_env.step("I don't know")
    assert reward == 0.0 and step_info["invalid_action"] is True and step_info["action"] == ""
    assert step_info["task_id"] == train_env.task_id_for_seed(3)


def test_reset_seed_and_unknown_task(train_env: MathEnv) -> None:
    assert train_env.reset(seed=11)[1]["task_id"] == train_env.task_ids()[11]
    assert train_env.reset(seed=11)[0] == train_env.reset(seed=11)[0]
    with pytest.raises(LookupError, match="nope"):
        train_env.reset(options={"task_id": "nope"})
    with pytest.raises(LookupError, match="nope"):
        train_env.reference_answer("nope")


def test_step_before_reset() -> None:
    with pytest.raises(RuntimeError, match="before reset"):
        MathEnv(num_tasks=3).step("\\boxed{1}")


def test_corpus_texts() -> None:
    texts = list(MathEnv.corpus_texts())
    assert texts[0] == MathEnv.system_prompt
    assert 2000 <= len(texts) <= 10_000
    assert sum(text.endswith("}.") and "\\boxed{" in text for text in texts) >= 1000
