"""Learning where reading is needed: smollm2-135m on the fetch env (``make test-learning``).

Fetch (hp_agent/envs/fetch.py) is won only by matching the goal's word against the
lists in the observation: a policy that does not read wins 1/9, and the held-out goals
are never fetched in training. The tiny model never learns it (1,200 SFT steps on clean
demonstrations left it at chance, docs/results.md), so these tests use the pretrained
smollm2-135m, restricted to admissible actions (every reply a valid ``go to NAME``).

Warm start, built once per test run: 150 SFT steps on the expert's demonstrations (the
model then reads: every held-out game won), then 30 steps at a tenth of the learning
rate on demonstrations whose every turn goes, with probability 1/2, to one of the two
wrong names instead. The model keeps
reading but no longer picks the right name every time, so it starts well below ceiling.

Each run trains from it on the train split (restricted, 8 episodes a step: HP-RLVR 8
prompts x 1 rollout, GRPO 1 prompt x 8), is evaluated on all 144 held-out games with the
warm start's seed, and must pass ``test_learning.improved`` (one-sided p < 0.01 and a
gain of at least 0.15); the flipped-credit controls must fail it and lose success.

Cost on a 2-core CPU: about 12 minutes for the warm start and 4-6 for each run, so the
file runs in ``make test-learning``; ``make test`` keeps the fetch env's own tests and
one restricted training step of each method (tests/test_constrained_decoding.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from test_learning import _flipped_rules, improved  # noqa: F401  (tests/ is on sys.path; the fixture registers the flipped rules)
from test_pretrained import needs_model

import hp_agent
from hp_agent.policies import SamplingParams, load_policy
from hp_agent.sft import demonstration_sequences, supervised_warmup

pytestmark = [pytest.mark.learning, pytest.mark.slow, needs_model]

MODEL = "smollm2-135m"
SAMPLING = SamplingParams(max_new_tokens=8, temperature=1.0)
EVAL_SEED = 1
# (demonstration mistakes, steps, peak lr): learn to read, then blur which name is picked.
# The blur's lr is low: at 1e-4, 40 steps took the reader (144/144) down to chance (16/144).
WARM_UP = ((0.0, 150, 1e-4), (0.5, 30, 1e-5))
SFT_BATCH = 4
RL_STEPS, RL_LR = 16, 2e-5
SHAPES = {"hp-rlvr": (8, 1), "grpo": (1, 8)}  # prompts a step, rollouts a prompt: 8 episodes either way


def held_out(model: str) -> tuple[int, int]:
    """(successes, episodes) of ``model`` on every held-out fetch game, restricted, once each."""
    result = hp_agent.evaluate(env="fetch", model=model, split="test", samples=1, sampling=SAMPLING, seed=EVAL_SEED,
                               constrain=True)
    return result.successes, result.episodes


def build_warm_start(out: Path) -> list[int]:
    torch.manual_seed(0)
    policy = load_policy(MODEL)
    for seed, (mistakes, steps, lr) in enumerate(WARM_UP):
        sequences = demonstration_sequences(policy, "fetch", {"split": "train", "demo_mistakes": mistakes, "demo_seed": seed})
        supervised_warmup(policy, sequences, steps, batch_size=SFT_BATCH, lr=lr, seed=seed)
    tmp = out.with_name(out.name + ".tmp")
    policy.model.save_pretrained(tmp)
    policy.tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return list(held_out(str(out)))


@pytest.fixture(scope="session")
def warm_start(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """(model folder, held-out (successes, episodes)), built by the first xdist worker that needs it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    model, scores = root / "fetch-warm-start", root / "fetch-warm-start.json"
    with FileLock(str(root / "fetch-warm-start.lock")):
        if not scores.is_file():
            scores.write_text(json.dumps(build_warm_start(model)))
    return model, json.loads(scores.read_text())


def train_and_score(warm: Path, algo: str, run_dir: Path) -> tuple[int, int]:
    prompts, group = SHAPES[algo.removesuffix("-flipped")]
    config = {
        "env": {"name": "fetch"},
        "model": {"name": str(warm)},
        "algo": {"name": algo, "group_size": group},
        # a trajectory's most hindsight-changed token gets full weight: the JSD weights'
        # scale (about 0.01 here) would otherwise slow HP-RLVR down by as much against GRPO
        "hindsight": {"weight_norm": "max"},
        "rollout": {"max_new_tokens": SAMPLING.max_new_tokens, "temperature": SAMPLING.temperature,
                    "constrain_to_admissible": True},
        "learner": {"lr": RL_LR},
        "trainer": {"steps": RL_STEPS, "prompts_per_step": prompts, "seed": 0, "run_dir": str(run_dir),
                    "name": algo, "save_trajectories": False, "checkpoint_every": RL_STEPS},
    }
    summary = hp_agent.train(config, progress=False)
    assert summary.steps == RL_STEPS and summary.grad_records > 0
    return held_out(str(summary.run_dir))


def _rates(before: list[int], after: tuple[int, int]) -> str:
    return f"held-out success {before[0]}/{before[1]} -> {after[0]}/{after[1]}"


def test_warm_start_reads_and_is_well_below_ceiling(warm_start) -> None:
    successes, episodes = warm_start[1]
    assert episodes == 144
    assert improved(round(episodes / 9), episodes, successes, episodes, min_gain=0.1)  # above chance: it reads
    assert successes / episodes <= 0.65, f"warm start {successes}/{episodes}"


@pytest.mark.parametrize("algo", ["hp-rlvr", "grpo"])
def test_rl_raises_held_out_success(warm_start, tmp_path: Path, algo: str) -> None:
    warm, before = warm_start
    after = train_and_score(warm, algo, tmp_path)
    message = f"fetch {algo}: {_rates(before, after)}"
    print(message)
    assert improved(*before, *after), message


@pytest.mark.parametrize("algo", ["hp-rlvr-flipped", "grpo-flipped"])
def test_flipped_credit_fails_the_criterion(warm_start, tmp_path: Path, algo: str) -> None:
    warm, before = warm_start
    after = train_and_score(warm, algo, tmp_path)
    message = f"fetch {algo}: {_rates(before, after)}"
    print(message)
    assert not improved(*before, *after), message
    assert improved(*after, *before, min_gain=0.0), message
