"""Learning tests: HP-RLVR and GRPO must raise held-out success, and a flipped credit must not.

Set-up, built once per test run and shared by xdist workers through a file lock: the
tiny model is warmed up (200 supervised steps, about 60 s) on noisy demonstrations of
the two box-and-key envs (hp_agent/envs/toy.py): the expert's action or, with
probability 1/2, one of the other two actions. It learns the actions and reads the state,
but picks the right action only part of the time: 0.42 held-out success in the
multi-turn ``keys`` game and 0.51 in the single-step ``keystep`` task (ceiling 1.0).

Each test trains from that warm start on the train split, evaluates the trained model
on every task of the held-out split (colour sets never seen in training; 252 episodes
for ``keys``, 672 for ``keystep``) with the sampling and seed the warm start was
evaluated with (temperature 1, the training temperature), and applies :func:`improved`.
Two RL seeds per algorithm and env.

Negative control: the same runs with the credit's sign flipped (rules registered here)
must fail :func:`improved`, and must make the policy worse, so the criterion can fail
and the credit's sign is what drives the learning.

Measured on a 2-core CPU (held-out success, warm start -> trained, seeds 0 and 1):
keys HP-RLVR 0.42 -> 0.87, 0.88; keys GRPO 0.42 -> 0.88, 0.80; keystep HP-RLVR
0.51 -> 0.93, 0.89; keystep GRPO 0.51 -> 0.93, 0.91; flipped: keys 0.42 -> 0.00 (both
algorithms), keystep 0.51 -> 0.07 (HP-RLVR), 0.19 (GRPO). ``make test`` runs keystep's
seed 0 and its controls (about 4 CPU-minutes beside the warm start's 3); keys, the second
seeds and keys' controls are ``make test-learning``.

The related methods (``make test-learning``), seed 0, warm start 0.417 keys / 0.525 keystep:
SPO 0.853 / 0.961, HCAPO 0.817 / 0.906, GiGPO 0.861 / 0.923; flipped 0.012 / 0.010,
0.000 / 0.001, 0.000 / 0.116. OPSD 0.000 / 0.000, its flipped control 0.004 / 0.945 (see
``OPSD_FAILS``). GRPO plus the distillation term (topk, 0.1): 0.813 / 0.914, with GRPO's
credit flipped 0.000 / 0.000; the term alone 0.000 / 0.000 (``DISTILL_FAILS``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from filelock import FileLock

import hp_agent
from hp_agent.credit.rules import CreditBatch, CreditOptions, grpo_credit, hp_rlvr_credit
from hp_agent.credit.registry import CREDIT_RULES, register_credit
from hp_agent.evaluation import improvement_p_value, wilson_interval
from hp_agent.policies import SamplingParams, load_policy
from hp_agent.sft import demonstration_sequences, supervised_warmup

ENVS = ("keys", "keystep")
# Warm-up: half the demonstrated actions are wrong; 200 steps fit that mixture (fewer
# leave the policy reading the state only weakly, and RL then starts from near chance).
DEMO_MISTAKES = 0.5
SFT_STEPS, SFT_BATCH, SFT_LR = 200, 16, 1e-3
# RL budgets: 16 episodes a step (HP-RLVR: 16 prompts x 1 rollout; GRPO: 2 prompts x 8
# rollouts), two optimizer steps a step (mini-batches of 8 and of 1 prompt). Both learn at 1e-4: at 3e-4 GRPO fell, on 2 of
# 5 seeds, into "always open, never walk on", which wins only when the key is in the
# first box (1/3 of the tasks), and HP-RLVR collapsed on keys seed 1 (0.42 -> 0.00,
# writing "n" and stopping; docs/results.md has the analysis) once a fresh install's
# warm start scored 0.42 instead of 0.43 (same code). HP-RLVR gets 24 steps at 1e-4.
@dataclass(frozen=True)
class Budget:
    """One algorithm's training budget and learning rate."""

    steps: int
    prompts_per_step: int
    group_size: int
    lr: float
    mini_batch_prompts: int


BUDGETS = {"hp-rlvr": Budget(24, 16, 1, 1e-4, 8), "grpo": Budget(20, 2, 8, 1e-4, 1)}
# The related methods (hp_agent/credit/related.py) take the budget of their kind: one
# rollout a prompt as HP-RLVR, a group of 8 as GRPO.
RELATED = ("opsd", "spo", "hcapo", "gigpo")
BUDGETS.update({"opsd": BUDGETS["hp-rlvr"], "spo": BUDGETS["hp-rlvr"], "hcapo": BUDGETS["grpo"], "gigpo": BUDGETS["grpo"],
                "distill-only": BUDGETS["hp-rlvr"]})
# The distillation term (learner.distill=topk): beside GRPO at a small coefficient, and
# alone (a rule giving zero credit, the term the whole loss) at 1.
DISTILL = {"distill": "topk", "distill_coef": 0.1}
DISTILL_ALONE = {"distill": "topk", "distill_coef": 1.0}
# "open" is 3 tokens, "use key" 2, plus the end-of-turn token.
SAMPLING = SamplingParams(max_new_tokens=5, temperature=1.0)
EVAL_SEED = 1

# The learning criterion (see improved()).
ALPHA = 0.01
MIN_GAIN = 0.15


def improved(before_successes: int, before_n: int, after_successes: int, after_n: int,
             alpha: float = ALPHA, min_gain: float = MIN_GAIN) -> bool:
    """True when the after-success rate beats the before-rate beyond evaluation noise.

    Two conditions, both required:

    * significance: :func:`hp_agent.evaluation.improvement_p_value` (a one-sided
      two-proportion z-test) rejects "after <= before" at level ``alpha`` (0.01);
    * size: the absolute gain is at least ``min_gain`` (0.15). With about 250 held-out
      episodes per evaluation the standard error of a difference of two rates near 0.5 is
      about 0.045, so the z-test alone would accept gains of about 0.10; 0.15 (over 3
      standard errors) asks for a change of behaviour rather than a lucky draw, and still
      leaves the trained policies (gains of 0.3-0.5) a wide margin.

    >>> improved(100, 250, 200, 250), improved(100, 250, 120, 250), improved(100, 250, 60, 250)
    (True, False, False)
    """
    p_value = improvement_p_value(before_successes, before_n, after_successes, after_n)
    gain = after_successes / after_n - before_successes / before_n
    return p_value < alpha and gain >= min_gain


def test_improved_accepts_clear_gains_only() -> None:
    assert improved(100, 250, 200, 250)
    assert not improved(100, 250, 125, 250)  # 0.10 gain: significant at 0.05 only, too small
    assert not improved(10, 20, 16, 20)  # a 0.30 gain on 20 episodes: p ~ 0.02, not < 0.01
    assert not improved(200, 250, 100, 250)  # a drop
    assert not improved(0, 250, 0, 250) and not improved(250, 250, 250, 250)
    with pytest.raises(ValueError):
        improved(0, 0, 1, 1)


# ---- negative-control credit rules ---------------------------------------------------


def _flipped_hp_rlvr(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    credit, metrics = hp_rlvr_credit(batch, options)
    return -credit, metrics


def _flipped_grpo(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    credit, metrics = grpo_credit(batch, options)
    return -credit, metrics


def _flipped(name: str) -> None:
    """Register '<name>-flipped': the rule ``name`` with its credit negated, otherwise alike."""
    rule = CREDIT_RULES[name]

    def flipped(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
        credit, metrics = rule.fn(batch, options)
        return -credit, metrics

    register_credit(f"{name}-flipped", hindsight=rule.hindsight, group_size=rule.group_size,
                    min_group_size=rule.min_group_size, baseline_decay=rule.baseline_decay)(flipped)


def _no_credit(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    return torch.zeros(batch.token_turn.shape), {}


@pytest.fixture(scope="module", autouse=True)
def _flipped_rules() -> Iterator[None]:
    """'hp-rlvr-flipped' and 'grpo-flipped': the built-in rules with the credit negated; and
    the related methods' flipped rules."""
    register_credit("hp-rlvr-flipped", hindsight=True)(_flipped_hp_rlvr)
    register_credit("grpo-flipped", group_size=8, min_group_size=2)(_flipped_grpo)
    for name in RELATED:
        _flipped(name)
    register_credit("distill-only", hindsight=True)(_no_credit)
    yield
    for name in ("hp-rlvr-flipped", "grpo-flipped", "distill-only", *(f"{name}-flipped" for name in RELATED)):
        CREDIT_RULES.pop(name, None)


# ---- the shared warm start -----------------------------------------------------------


def held_out_successes(model: str, env: str) -> tuple[int, int]:
    """(successes, episodes) of ``model`` on every held-out task of ``env``, once each."""
    result = hp_agent.evaluate(env=env, model=model, split="test", samples=1, sampling=SAMPLING, seed=EVAL_SEED)
    return result.successes, result.episodes


def build_warm_start(out: Path, seed: int = 0) -> dict[str, list[int]]:
    """Warm the tiny model up on noisy demonstrations of both envs (``seed``: of the
    mistakes, batches and torch), save it to ``out`` and return its held-out
    (successes, episodes) per env."""
    torch.manual_seed(seed)
    policy = load_policy("tiny")
    sequences = []
    for env in ENVS:
        kwargs = {"split": "train", "demo_mistakes": DEMO_MISTAKES, "demo_seed": seed}
        sequences += demonstration_sequences(policy, env, kwargs)
    supervised_warmup(policy, sequences, SFT_STEPS, batch_size=SFT_BATCH, lr=SFT_LR, seed=seed)
    tmp = out.with_name(out.name + ".tmp")
    policy.model.save_pretrained(tmp)
    policy.tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return {env: list(held_out_successes(str(out), env)) for env in ENVS}


@pytest.fixture(scope="session")
def warm_start(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[int]]]:
    """(model folder, held-out (successes, episodes) per env) of the warm start, built by
    the first xdist worker that needs it and read by the others."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # xdist: workers share the parent of their base folders
        root = root.parent
    model, scores = root / "learning-warm-start", root / "learning-warm-start.json"
    with FileLock(str(root / "learning-warm-start.lock")):
        if not scores.is_file():
            scores.write_text(json.dumps(build_warm_start(model)))
    return model, json.loads(scores.read_text())


# ---- training runs -------------------------------------------------------------------


def train_and_score(warm: Path, env: str, algo: str, seed: int, run_dir: Path, off_policy_steps: int = 0,
                    backend: str = "hf", steps: int | None = None, learner: dict | None = None) -> tuple[int, int]:
    """Train from ``warm`` with the budget of ``algo`` (a flipped rule: its base's; ``steps``
    of them where given), ``off_policy_steps`` behind (``trainer.off_policy_steps``), rolled
    out by ``backend``, with further ``learner`` keys; return the held-out (successes, episodes) after."""
    budget = BUDGETS[algo.removesuffix("-flipped")]
    steps = budget.steps if steps is None else steps
    config = {
        "env": {"name": env},
        "model": {"name": str(warm), "backend": backend},
        "algo": {"name": algo, "group_size": budget.group_size},
        "rollout": {"max_new_tokens": SAMPLING.max_new_tokens, "temperature": SAMPLING.temperature},
        "learner": {"lr": budget.lr, "mini_batch_prompts": budget.mini_batch_prompts, **(learner or {})},
        "trainer": {
            "steps": steps,
            "prompts_per_step": budget.prompts_per_step,
            "seed": seed,
            "run_dir": str(run_dir),
            "name": f"{env}-{algo}-{seed}",
            "save_trajectories": False,
            "checkpoint_every": steps,
            "off_policy_steps": off_policy_steps,
        },
    }
    summary = hp_agent.train(config, progress=False)
    assert summary.steps == steps and summary.grad_records > 0
    return held_out_successes(str(summary.run_dir), env)


def _rates(before: list[int], after: tuple[int, int]) -> str:
    return f"held-out success {before[0]}/{before[1]} = {before[0] / before[1]:.3f} -> {after[0]}/{after[1]} = {after[0] / after[1]:.3f}"


@pytest.mark.slow
@pytest.mark.parametrize("env", ENVS)
def test_warm_start_is_well_below_ceiling(warm_start, env: str) -> None:
    successes, episodes = warm_start[1][env]
    assert episodes >= 250  # every held-out task: enough for the z-test to see 0.15
    assert 0.2 <= successes / episodes <= 0.65, f"{env}: warm start {successes}/{episodes}"


@pytest.mark.slow
def test_evaluation_repeats_exactly(warm_start) -> None:
    """Both sides of the criterion are evaluated with one seed: evaluate() seeds its
    sampling, so the warm start scores the same again (and this process's torch stream,
    which a later training run would draw from, does not matter)."""
    warm, before = warm_start
    torch.manual_seed(12345)
    assert list(held_out_successes(str(warm), "keystep")) == before["keystep"]


def _long(env: str, seed: int = 0) -> list[pytest.MarkDecorator]:
    """keys (multi-turn, ~4 CPU-min a run) and every second seed go to ``make test-learning``;
    keystep's seed 0 and its controls stay in ``make test``."""
    return [pytest.mark.learning] if env == "keys" or seed else []


@pytest.mark.slow
@pytest.mark.parametrize(("env", "algo", "seed"), [pytest.param(env, algo, seed, marks=_long(env, seed))
                                                    for env in ENVS for algo in ("hp-rlvr", "grpo") for seed in (0, 1)])
def test_rl_raises_held_out_success(warm_start, tmp_path: Path, env: str, algo: str, seed: int) -> None:
    warm, before = warm_start
    after = train_and_score(warm, env, algo, seed, tmp_path)
    message = f"{env} {algo} seed {seed}: {_rates(before[env], after)}"
    print(message)  # the measured numbers, shown with pytest -rA
    assert improved(*before[env], *after), message


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["hp-rlvr-flipped", "grpo-flipped"])
@pytest.mark.parametrize("env", [pytest.param(env, marks=_long(env)) for env in ENVS])
def test_flipped_credit_fails_the_criterion(warm_start, tmp_path: Path, env: str, algo: str) -> None:
    warm, before = warm_start
    after = train_and_score(warm, env, algo, 0, tmp_path)
    message = f"{env} {algo}: {_rates(before[env], after)}"
    print(message)
    assert not improved(*before[env], *after), message
    # Not only no gain: learning against the reward makes the policy worse (one-sided
    # test at the same level, any size of drop).
    assert improved(*after, *before[env], min_gain=0.0), message


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize(("algo", "seed"), [("hp-rlvr", 0), ("hp-rlvr", 1), ("grpo", 0), ("grpo", 1), ("hp-rlvr-flipped", 0)])
def test_one_step_off_learns_keys_as_the_synchronous_run_does(warm_start, tmp_path: Path, algo: str, seed: int) -> None:
    """trainer.off_policy_steps=1 (each batch generated and scored by the weights one update
    older): held-out success passes the criterion and lies in the 95% interval of the
    synchronous run's; the flipped control still fails."""
    warm, before = warm_start
    synchronous = train_and_score(warm, "keys", algo, seed, tmp_path / "synchronous")
    one_step_off = train_and_score(warm, "keys", algo, seed, tmp_path / "one-step-off", off_policy_steps=1)
    low, high = wilson_interval(*synchronous)
    message = (f"keys {algo} seed {seed}: synchronous {_rates(before['keys'], synchronous)} [{low:.3f}, {high:.3f}]; "
               f"one-step-off {_rates(before['keys'], one_step_off)}")
    print(message)
    if algo.endswith("-flipped"):
        assert not improved(*before["keys"], *one_step_off), message
    else:
        assert improved(*before["keys"], *one_step_off) and low <= one_step_off[0] / one_step_off[1] <= high, message


# OPSD's credit is the teacher's log-prob minus the student's; here the teacher is the tiny
# model shown the outcome, not a solution, and it was never taught to read that block: the
# block shifts its distribution (a longer, unfamiliar context) without pointing at the right
# action, and OPSD drives held-out success to 0 on both envs (measured: keys 0.417 -> 0.000,
# keystep 0.525 -> 0.000), while on keystep the flipped credit raises it (0.525 -> 0.945).
# Strict: a change that makes OPSD learn here shows as a failure to be looked at.
OPSD_FAILS = pytest.mark.xfail(strict=True, reason="OPSD needs a teacher that reads its privileged block (docs/results.md)")


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize(("env", "algo"), [pytest.param(env, algo, marks=[OPSD_FAILS] if algo == "opsd" else [])
                                           for env in ENVS for algo in RELATED])
def test_related_rules_raise_held_out_success(warm_start, tmp_path: Path, env: str, algo: str) -> None:
    """OPSD, SPO, HCAPO and GiGPO from the same warm start, with their kind's budget."""
    warm, before = warm_start
    after = train_and_score(warm, env, algo, 0, tmp_path)
    message = f"{env} {algo} seed 0: {_rates(before[env], after)}"
    print(message)
    assert improved(*before[env], *after), message


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize(("env", "algo"), [
    pytest.param(env, f"{name}-flipped", marks=[OPSD_FAILS] if (env, name) == ("keystep", "opsd") else [])
    for env in ENVS for name in RELATED])
def test_related_rules_flipped_fail_the_criterion(warm_start, tmp_path: Path, env: str, algo: str) -> None:
    warm, before = warm_start
    after = train_and_score(warm, env, algo, 0, tmp_path)
    message = f"{env} {algo}: {_rates(before[env], after)}"
    print(message)
    assert not improved(*before[env], *after), message


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize("env", ENVS)
def test_grpo_with_the_distillation_term_raises_held_out_success(warm_start, tmp_path: Path, env: str) -> None:
    """GRPO plus learner.distill=topk (0.1) learns as GRPO does; with GRPO's credit flipped
    the term does not rescue it (the control)."""
    warm, before = warm_start
    after = train_and_score(warm, env, "grpo", 0, tmp_path / "grpo", learner=DISTILL)
    flipped = train_and_score(warm, env, "grpo-flipped", 0, tmp_path / "flipped", learner=DISTILL)
    message = f"{env} grpo+distill seed 0: {_rates(before[env], after)}; flipped: {_rates(before[env], flipped)}"
    print(message)
    assert improved(*before[env], *after) and not improved(*before[env], *flipped), message


# Measured (seed 0): distillation alone drives held-out success to 0 on both envs (keys
# 0.417 -> 0.000, keystep 0.525 -> 0.000), as OPSD does and for OPSD's reason: the tiny
# model's hindsight-conditioned distribution does not point at the right action; ascending
# the divergence leaves keys at 0.000 and keystep at 0.585 (not a gain by the criterion).
DISTILL_FAILS = pytest.mark.xfail(strict=True, reason="the teacher does not read its privileged block (OPSD_FAILS)")


@pytest.mark.slow
@pytest.mark.learning
@DISTILL_FAILS
@pytest.mark.parametrize("env", ENVS)
def test_the_distillation_term_alone(warm_start, tmp_path: Path, env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The term as the whole loss (zero credit), toward the hindsight-conditioned policy;
    the control ascends the same divergence (its sign flipped in the kernel)."""
    import hp_agent.kernels as kernels

    warm, before = warm_start
    after = train_and_score(warm, env, "distill-only", 0, tmp_path / "on", learner=DISTILL_ALONE)
    support_jsd = kernels.support_jsd
    monkeypatch.setattr(kernels, "support_jsd", lambda *args: -support_jsd(*args))
    flipped = train_and_score(warm, env, "distill-only", 0, tmp_path / "flipped", learner=DISTILL_ALONE)
    message = f"{env} distillation alone seed 0: {_rates(before[env], after)}; ascended: {_rates(before[env], flipped)}"
    print(message)
    assert improved(*before[env], *after) and not improved(*before[env], *flipped), message
