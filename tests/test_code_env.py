"""Code env: task generator, JSONL loader, program extraction, verifier, env API, training."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

import hp_agent
from hp_agent.envs import make
from hp_agent.envs.code import CodeEnv
from hp_agent.envs.code.families import FAMILIES, TESTS_PER_PROBLEM
from hp_agent.envs.code.families.reference import functional_problem, stdin_problem
from hp_agent.envs.code.jsonl import load_jsonl_tasks
from hp_agent.envs.code.tasks import PUBLIC_TESTS, CodeTask, builtin_tasks
from hp_agent.envs.generated import split_of
from hp_agent.files import read_jsonl_records
from hp_agent.verifiers.code import (
    NO_CODE_FEEDBACK,
    TestCase,
    extract_program,
    parse_arguments,
    verify_batch,
    verify_code,
    verify_program,
)
from hp_agent.verifiers.sandbox import SandboxLimits

LIMITS = SandboxLimits(timeout_s=2.0, cpu_time_s=2)


def _functional(tests: list[tuple[str, str, bool]], name: str = "f") -> CodeTask:
    return CodeTask("t", "q", "functional", tuple(TestCase(i, o, p) for i, o, p in tests), name, "unit", 1)


def _stdin(tests: list[tuple[str, str, bool]]) -> CodeTask:
    return CodeTask("t", "q", "stdin", tuple(TestCase(i, o, p) for i, o, p in tests), None, "unit", 1)


@pytest.fixture(scope="module")
def train_tasks() -> tuple[CodeTask, ...]:
    return builtin_tasks("train", 1000)


@pytest.fixture(scope="module")
def test_tasks() -> tuple[CodeTask, ...]:
    return builtin_tasks("test", 200)


# ---- generator -------------------------------------------------------------------


def test_generator_is_deterministic_and_fast() -> None:
    start = time.perf_counter()
    first = builtin_tasks("train", 300, seed=3)
    assert time.perf_counter() - start < 2.0
    assert first == builtin_tasks.__wrapped__("train", 300, seed=3)  # not just the cache
    assert builtin_tasks("train", 100, seed=3) == first[:100]
    assert [t.question for t in builtin_tasks("train", 50, seed=4)] != [t.question for t in first[:50]]


def test_ids_sizes_and_uniqueness(train_tasks, test_tasks) -> None:
    assert len(train_tasks) == 1000 and len(test_tasks) == 200
    assert train_tasks[42].id == "gen-train-00042" and test_tasks[0].id == "gen-test-00000"
    for tasks in (train_tasks, test_tasks):
        assert len({t.id for t in tasks}) == len(tasks)
        assert len({t.question.split("\n\n")[0] for t in tasks}) == len(tasks)  # distinct statements


def test_splits_are_disjoint_by_statement(train_tasks, test_tasks) -> None:
    statements = {split: {t.question.split("\n\n")[0] for t in tasks} for split, tasks in
                  (("train", train_tasks), ("test", test_tasks))}
    assert not statements["train"] & statements["test"]
    assert all(split_of(s) == "train" for s in statements["train"])
    assert all(split_of(s) == "test" for s in statements["test"])
    other_seed = {t.question.split("\n\n")[0] for t in builtin_tasks("test", 200, seed=1)}
    assert not other_seed & statements["train"]


def test_every_family_kind_and_level_in_both_splits(train_tasks, test_tasks) -> None:
    assert len(FAMILIES) >= 8
    for tasks in (train_tasks, test_tasks):
        assert {t.task_type for t in tasks} == set(FAMILIES)
        assert {t.difficulty for t in tasks} == {1, 2, 3}
        assert {t.kind for t in tasks} == {"functional", "stdin"}


def test_generated_tests_are_well_formed(train_tasks, test_tasks) -> None:
    for task in train_tasks + test_tasks:
        assert len(task.tests) == TESTS_PER_PROBLEM
        assert [t.public for t in task.tests] == [True] * PUBLIC_TESTS + [False] * (TESTS_PER_PROBLEM - PUBLIC_TESTS)
        assert len({t.output for t in task.tests}) >= 2, task.id  # a constant program cannot pass
        assert task.solution and task.solution not in task.question
        assert "Example 1:" in task.question and "Example 3:" not in task.question
        if task.kind == "functional":
            assert f"def {task.func_name}(" in task.question  # the starter code
            for test in task.tests:
                parse_arguments(test.input), json.loads(test.output)
        else:
            assert "standard input" in task.question and task.func_name is None


def _cut(s: str, *, k: int, upper: str) -> str:
    """Return s cut at {k}, then
    '{upper}'."""
    return s[:k].upper() + upper


def _times(a: int, *, k: int) -> None:
    """Print a times {k}."""
    for _ in range(1):
        print(a * k)


def test_reference_program_is_the_function_with_its_values() -> None:
    problem = functional_problem("clip", _cut, [["abcd"]], k=-1, upper="x")
    assert problem.statement == "Return s cut at -1, then 'x'."  # the docstring, white space folded
    assert problem.starter == "def clip(s: str) -> str:"
    assert problem.solution == "def clip(s: str) -> str:\n    return s[:-1].upper() + 'x'\n"  # `.upper` stays
    namespace: dict = {}
    exec(problem.solution, namespace)
    assert namespace["clip"]("abcd") == _cut("abcd", k=-1, upper="x") == "ABCx"
    script = stdin_problem("One integer a. ", "a = int(input())\n", _times, ["3\n"], k=4)
    assert script.statement == "One integer a. Print a times 4." and script.starter == ""
    assert script.solution == "a = int(input())\nfor _ in range(1):\n    print(a * 4)\n"


def test_bad_split_and_size() -> None:
    with pytest.raises(ValueError, match=r"'dev'.*train, test"):
        builtin_tasks("dev", 10)
    with pytest.raises(ValueError, match=r"'dev'.*train, test"):
        CodeEnv(split="dev")
    with pytest.raises(ValueError, match="num_tasks"):
        CodeEnv(num_tasks=0)
    with pytest.raises(ValueError, match=r"timeout_s=0.*>= 0.01"):
        CodeEnv(timeout_s=0)
    with pytest.raises(ValueError, match=r"memory_mb=1.5.*integer|memory_mb=1.5.*>= 64"):
        CodeEnv(memory_mb=1.5)


# ---- program extraction and checking --------------------------------------------------


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Here:\n```python\nprint(1)\n```", "print(1)\n"),
        ("```\nx = 1\n```\nthen\n```py\nx = 2\n```", "x = 2\n"),
        ("```python\na = 1\n```\n```cpp\nint main() {}\n```", "a = 1\n"),
        ("```Python3\nb = 2```", "b = 2"),
        ("no code at all", None),
        ("```python\nprint('truncated", None),
        ("```cpp\nint main() {}\n```", None),
    ],
)
def test_extract_program(response: str, expected: str | None) -> None:
    assert extract_program(response) == expected


def test_no_code_block_scores_zero() -> None:
    result = verify_code("I would loop over it.", _functional([("1", "1", True)]))
    assert (result.verdict.reward, result.verdict.feedback, result.outcomes) == (0.0, NO_CODE_FEEDBACK, ())


def test_functional_values_compare_as_json() -> None:
    task = _functional([("[1, 2]\n3", "[[1, 2], 3]", True), ('"ab"\n2', '{"ab": true}', False)])
    program = "def f(x, y):\n    return (tuple(x), y) if isinstance(x, list) else {x: y == 2}\n"
    result = verify_program(program, task, LIMITS)
    assert result.verdict.success and result.fraction_passed == 1.0
    assert result.verdict.feedback == "passed all 2 tests"


def test_leetcode_solution_class_with_typing_annotations() -> None:
    task = _functional([("[3, 1, 2]", "3", True), ("[]", "0", False)], name="maxValue")
    program = ("class Solution:\n    def maxValue(self, nums: List[int]) -> Optional[int]:\n"
               "        return max(nums, default=0)\n")
    assert verify_program(program, task, LIMITS).verdict.success


def test_stdin_comparison_ignores_spacing_and_trailing_lines() -> None:
    task = _stdin([("2 3\n", "5\n6\n", True)])
    assert verify_program("a, b = map(int, input().split())\nprint(a + b, ' ')\nprint(a * b)\n\n", task,
                          LIMITS).verdict.success
    assert verify_program("print('5   \\n6\\n\\n')", task, LIMITS).verdict.success
    assert not verify_program("print(5, 6)", task, LIMITS).verdict.success  # lines still matter


def test_stdin_programs_may_exit_and_read_stdin_any_way() -> None:
    task = _stdin([("3\n1 2 3\n", "6\n", True), ("1\n7\n", "7\n", False)])
    for program in ("import sys\ndata = sys.stdin.read().split()\nprint(sum(map(int, data[1:])))\nsys.exit()\n",
                    "import sys\ninput = sys.stdin.buffer.readline\ninput()\nprint(sum(map(int, input().split())))\n",
                    "print(sum(map(int, open(0).read().split()[1:])))\nexit(0)\n"):
        assert verify_program(program, task, LIMITS).verdict.success, program


def test_feedback_names_public_failures_and_hides_private_outputs() -> None:
    task = _functional([("1", "2", True), ("2", "4", True), ("50", "987654", False), ("60", "123123", False)])
    result = verify_program("def f(x):\n    if x == 2:\n        raise KeyError('boom')\n    return x * 3\n", task,
                            LIMITS)
    feedback = result.verdict.feedback
    assert result.verdict.reward == 0.0 and result.fraction_passed == 0.0
    assert feedback.startswith("failed 4 of 4 tests")
    assert "public test 1: wrong return value, got '3'" in feedback
    assert "public test 2: KeyError: 'boom'" in feedback
    assert "private tests: 2 of 2 failed" in feedback
    assert "987654" not in feedback and "123123" not in feedback and "150" not in feedback


def test_feedback_for_timeouts_and_crashes() -> None:
    task = _stdin([("1\n", "1\n", True), ("2\n", "2\n", True)])
    limits = SandboxLimits(timeout_s=0.5, cpu_time_s=1)
    slow = verify_program("import time\nif input() == '2':\n    time.sleep(5)\nprint(1)\n", task, limits)
    assert slow.outcomes[0].passed and "public test 2: TimeoutError" in slow.verdict.feedback
    crashed = verify_program("import os\nos._exit(3)\n", task, limits)
    assert "public test 1: program exited (status 3)" in crashed.verdict.feedback
    assert "public test 2: not run" in crashed.verdict.feedback


def test_feedback_never_shows_the_reference_solution(test_tasks) -> None:
    tasks = list(test_tasks[:10])
    results = verify_batch(["print('nope')\n"] * len(tasks), tasks, workers=2, limits=LIMITS)
    for task, result in zip(tasks, results):
        assert result.verdict.reward == 0.0
        assert task.solution.strip() not in result.verdict.feedback
        private = [t.output.strip() for t in task.tests if not t.public and len(t.output.strip()) > 3]
        assert not any(output in result.verdict.feedback for output in private)
        assert len(result.verdict.feedback) < 600


def test_verify_batch_runs_in_parallel_like_serially(test_tasks) -> None:
    tasks = list(test_tasks[:8])
    programs = [t.solution if i % 2 else "print(0)\n" for i, t in enumerate(tasks)]
    serial = verify_batch(programs, tasks, workers=1, limits=LIMITS)
    parallel = verify_batch(programs, tasks, workers=4, limits=LIMITS)
    assert [r.verdict for r in serial] == [r.verdict for r in parallel]
    assert [r.verdict.success for r in serial] == [bool(i % 2) for i in range(8)]
    with pytest.raises(ValueError, match="one program per task"):
        verify_batch(programs[:3], tasks, workers=2)
    with pytest.raises(ValueError, match="workers"):
        verify_batch(programs, tasks, workers=0)


def test_reference_solutions_pass_and_wrong_programs_fail(train_tasks, test_tasks) -> None:
    sample = list(test_tasks[::4]) + list(train_tasks[::40])  # every family and level, both splits
    results = verify_batch([t.solution for t in sample], sample, workers=2, limits=LIMITS)
    assert [t.id for t, r in zip(sample, results) if not r.verdict.success] == []
    # The reference of another problem of the same family does not pass: tests discriminate.
    shifted = sample[1:] + sample[:1]
    wrong = verify_batch([t.solution for t in shifted], sample, workers=2, limits=LIMITS)
    assert sum(r.verdict.success for r in wrong) <= len(sample) // 20


# ---- JSONL loader ----------------------------------------------------------------


def _lcb_record(**overrides) -> dict:
    record = {
        "question_title": "Max", "question_id": "lc-1", "platform": "leetcode", "difficulty": "easy",
        "question_content": "Return the largest element.",
        "starter_code": "class Solution:\n    def maxValue(self, nums: List[int]) -> int:\n        ",
        "public_test_cases": json.dumps([{"input": "[1, 5, 2]", "output": "5", "testtype": "functional"}]),
        "private_test_cases": json.dumps([{"input": "[-3]", "output": "-3", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "maxValue"}),
    }
    record.update(overrides)
    return record


def _stdin_record() -> dict:
    return {"question_content": "Read n and print n + 1.", "starter_code": "",
            "public_test_cases": [{"input": "1\n", "output": "2\n", "testtype": "stdin"}],
            "private_test_cases": "[]", "metadata": "{}"}


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_load_jsonl_livecodebench_layout(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "lcb.jsonl", [_lcb_record(), "", _stdin_record()])
    functional, stdin = load_jsonl_tasks(path)
    assert (functional.id, functional.kind, functional.func_name) == ("lc-1", "functional", "maxValue")
    assert (functional.task_type, functional.difficulty) == ("easy", 1)
    assert [t.public for t in functional.tests] == [True, False]
    assert "class Solution:" in functional.question and "Return the largest element." in functional.question
    assert (stdin.id, stdin.kind, stdin.func_name, stdin.task_type) == ("lcb-3", "stdin", None, "jsonl")
    assert "standard input" in stdin.question
    env = CodeEnv(data=path, split="test")
    assert env.task_ids() == ["lc-1", "lcb-3"] and list(env.demonstrations()) == []
    env.reset(options={"task_id": "lc-1"})
    program = "class Solution:\n    def maxValue(self, nums):\n        return max(nums)\n"
    assert env.step(f"```python\n{program}```")[1] == 1.0
    check_env(env, skip_render_check=True)


@pytest.mark.parametrize(
    ("record", "pattern"),
    [
        ("{not json", r":1: invalid JSON"),
        (["q"], r":1: expected a JSON object"),
        (_lcb_record(question_content=None) | {}, r":1: bad value for key 'question_content'"),
        ({k: v for k, v in _lcb_record().items() if k != "public_test_cases"}, r":1: missing key 'public_test_cases'"),
        (_lcb_record(tests="x"), r":1: unknown key 'tests'"),
        (_lcb_record(private_test_cases="eJzLSM3JyQcABiwCFQ=="), r"key 'private_test_cases'.*pickle"),
        (_lcb_record(public_test_cases='[{"input": "1", "output": "1", "testtype": "call"}]'),
         r"key 'public_test_cases': test 1 has testtype 'call'; valid testtypes: functional, stdin"),
        (_lcb_record(public_test_cases='[{"input": "1"}]'),
         r"test 1 must be an object with input, output and testtype"),
        (_lcb_record(metadata="{}"), r"key 'metadata': functional tests need"),
        (_lcb_record(public_test_cases='[{"input": "[1,", "output": "1", "testtype": "functional"}]'),
         r"functional test 1 .* is not JSON"),
        (_lcb_record(public_test_cases="[]", private_test_cases="[]"), r"no tests"),
        (_lcb_record(private_test_cases='[{"input": "1", "output": "1", "testtype": "stdin"}]'), r"mix testtypes"),
    ],
)
def test_load_jsonl_errors_name_file_line_and_key(tmp_path: Path, record, pattern: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [record])
    with pytest.raises(ValueError, match=pattern) as error:
        load_jsonl_tasks(path)
    assert f"{path}:1" in str(error.value)


def test_load_jsonl_duplicates_and_empty(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r":2: duplicate id 'lc-1' \(first used on line 1\)"):
        load_jsonl_tasks(write_jsonl(tmp_path / "dup.jsonl", [_lcb_record(), _lcb_record()]))
    with pytest.raises(ValueError, match="no tasks"):
        load_jsonl_tasks(write_jsonl(tmp_path / "empty.jsonl", ["", " "]))


# ---- env -------------------------------------------------------------------------


def test_make_code_defaults() -> None:
    env = make("code")
    assert isinstance(env, CodeEnv)
    assert len(env.task_ids()) == 1000 and env.task_ids()[0] == "gen-train-00000"
    assert len(CodeEnv(split="test").task_ids()) == 200
    assert env.reward_bounds == (0.0, 1.0) and env.max_turns == 1
    assert "```python" in (env.system_prompt or "")
    assert CodeEnv.eval_split == "test"  # what `hp-agent eval --env code` scores by default


def test_check_env() -> None:
    check_env(CodeEnv(num_tasks=20, timeout_s=2.0), skip_render_check=True)


def test_reset_and_step() -> None:
    env = CodeEnv(split="test", num_tasks=30)
    task_id = env.task_ids()[7]
    obs, info = env.reset(options={"task_id": task_id})
    task = env.task(task_id)
    assert obs == task.question and info == {"task_id": task_id, "task_type": task.task_type,
                                             "difficulty": task.difficulty}
    obs2, reward, terminated, truncated, step_info = env.step(f"Sure.\n```python\n{task.solution}```\nDone.")
    assert (obs2, reward, terminated, truncated) == ("", 1.0, True, False)
    assert step_info["action"] == task.solution and step_info["invalid_action"] is False
    assert step_info["tests_passed"] == 1.0 and step_info["tests_total"] == TESTS_PER_PROBLEM
    assert step_info["verdict"].success and step_info["shaping"] == 0.0
    assert list(step_info)[-1] == "verdict"
    with pytest.raises(RuntimeError, match="reset"):
        env.step("```python\npass\n```")

    env.reset(seed=3)
    _, reward, _, _, step_info = env.step("I don't know")
    assert reward == 0.0 and step_info["invalid_action"] is True and step_info["action"] == ""
    assert step_info["verdict"].feedback == NO_CODE_FEEDBACK and step_info["task_id"] == env.task_id_for_seed(3)
    with pytest.raises(LookupError, match="nope"):
        env.reset(options={"task_id": "nope"})
    with pytest.raises(RuntimeError, match="before reset"):
        CodeEnv(num_tasks=3).step("```python\npass\n```")


def test_demonstrations_pass_the_verifier() -> None:
    env = CodeEnv(split="train", num_tasks=60)
    demos = list(env.demonstrations())
    assert len(demos) == 60
    tasks = [env.task(task_id) for task_id in env.task_ids()]
    for (prompt, response), task in zip(demos, tasks):
        assert prompt == task.question
        assert response.startswith("```python\n") and response.endswith("```")
    results = [verify_code(response, task, LIMITS) for (_, response), task in zip(demos[:30], tasks)]
    assert all(r.verdict.success for r in results), [r.verdict.feedback for r in results if not r.verdict.success]


def test_corpus_texts() -> None:
    texts = list(CodeEnv.corpus_texts())
    assert texts[0] == CodeEnv.system_prompt
    assert len(texts) == 1 + 2 * 1000
    assert sum(text.startswith("```python\n") for text in texts) == 1000


# ---- training and evaluation on the tiny model -------------------------------------------


def _train_config(tmp_path: Path, algo: str) -> dict:
    return {
        "env": {"name": "code", "kwargs": {"num_tasks": 20}},
        "algo": {"name": algo, **({"group_size": 2} if algo == "grpo" else {})},
        "rollout": {"max_new_tokens": 48},
        "learner": {"lr": 1e-4},
        "trainer": {"steps": 2, "prompts_per_step": 2, "run_dir": str(tmp_path), "name": algo, "checkpoint_every": 2},
    }


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["hp-rlvr", "grpo"])
def test_code_env_trains_with_both_algorithms(tmp_path: Path, algo: str) -> None:
    summary = hp_agent.train(_train_config(tmp_path, algo), progress=False)
    assert summary.steps == 2
    metrics = read_jsonl_records(summary.run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    trajectories = read_jsonl_records(summary.run_dir / "trajectories.jsonl")
    assert len(trajectories) == 2 * 2 * (2 if algo == "grpo" else 1)
    assert all(t["feedback"] for t in trajectories)  # every episode was verified
    assert len(read_jsonl_records(summary.run_dir / "grad_norms.jsonl")) == 2


@pytest.mark.slow
def test_evaluate_code_pass_at_k() -> None:
    result = hp_agent.evaluate(env="code", model="tiny", samples=8, limit=2, parallel_envs=8)
    assert (result.env, result.split, result.tasks, result.samples) == ("code", "test", 2, 8)
    # Every one of the 16 programs went through the sandbox (none errored), one turn each;
    # a random 2.8M-parameter model writes no program that passes.
    assert (result.errored, result.mean_turns, result.avg_at_k, result.pass_at_k) == (0, 1.0, 0.0, 0.0)
