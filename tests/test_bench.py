"""The generation benchmark runs and prints its model.generate ratio (a smoke test: no timing is asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_generation_bench_prints_our_sampler_against_model_generate() -> None:
    command = [sys.executable, "bench/generation.py", "--backends", "hf,hf-no-reuse,generate", "--episodes", "2",
               "--group-size", "2", "--turns", "2", "--new-tokens", "4", "--repeats", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"hf_tokens_per_s", "hf-no-reuse_tokens_per_s", "generate_tokens_per_s"} <= result.keys()
    assert result["hf_over_generate"] > 0 and result["sync_s"] is None
    assert "ratio hf / model.generate" in done.stdout


def test_generation_bench_names_a_bad_backend() -> None:
    done = subprocess.run([sys.executable, "bench/generation.py", "--backends", "hf,trl"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--backends" in done.stderr and "'hf-no-reuse'" in done.stderr


def test_train_step_bench_prints_the_learner_packing_ratios() -> None:
    command = [sys.executable, "bench/train_step.py", "--learner-packing", "--env", "math", "--env-kwargs", "{}",
               "--prompts", "1", "--group", "2", "--max-new-tokens", "4", "--repeats", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "grpo batch: env=math model=tiny 1 prompts x G=2, 2 sequences" in done.stdout and "packed / padded: time" in done.stdout


def test_off_policy_bench_prints_synchronous_against_one_step_off() -> None:
    command = [sys.executable, "bench/off_policy.py", "--env", "keys", "--algos", "hp-rlvr", "--prompts", "2",
               "--max-turns", "2", "--steps", "1", "--warmup", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["hp-rlvr_ratio"] == pytest.approx(result["hp-rlvr_sync_s"] / result["hp-rlvr_one_step_off_s"])
    assert result["hp-rlvr_learner_scores_ratio"] == pytest.approx(result["hp-rlvr_sync_s"] / result["hp-rlvr_learner_scores_s"])
    assert "hp-rlvr (G=1) env=keys model=tiny 2 prompts x G" in done.stdout and "with the learner scoring" in done.stdout


def test_alfworld_turns_bench_prints_tokens_and_seconds_per_turn_by_prompt_mode() -> None:
    command = [sys.executable, "bench/alfworld_turns.py", "--model", "tiny", "--games", "2", "--turns", "2",
               "--modes", "verl-agent", "append"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["verl-agent"], ["append"])}
    assert rows["verl-agent"][1] == rows["append"][1] == "4"  # 2 games x 2 turns each
    assert float(rows["append"][4]) < float(rows["verl-agent"][4])  # append runs fewer prompt tokens a turn
    assert rows["append"][-1].endswith("x")
