"""One-step-off training (trainer.off_policy_steps): 0 is the synchronous loop exactly; with
k >= 1 the batch trained at step t was generated, and scored, by the weights after
max(t - k, first step) updates (each trajectory records its version); the weights cross to
the rollout process through shared memory; a killed run resumes without training a
trajectory twice or skipping one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import hp_agent
from hp_agent.async_rollout import RolloutProcess
from hp_agent.config import ConfigError, load_config
from hp_agent.distributed import SINGLE
from hp_agent.envs import make
from hp_agent.errors import UserError
from hp_agent.files import read_jsonl_records
from hp_agent.hindsight import ScoringOptions, score_trajectories
from hp_agent.policies import load_policy
from hp_agent.rollout import PhaseTimes
from hp_agent.run_folder import latest_checkpoint
from hp_agent.scored_batch import RolloutJob
from hp_agent.trainer import TaskSampler

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, name: str, algo: str = "hp-rlvr", steps: int = 3, **trainer) -> dict:
    return {
        "env": {"name": "keys"},
        "algo": {"name": algo, **({"group_size": 4} if algo == "grpo" else {})},
        "rollout": {"max_new_tokens": 5, "max_turns": 3},
        "learner": {"lr": 1e-3, "mini_batch_prompts": 2},
        "trainer": {"steps": steps, "prompts_per_step": 2, "run_dir": str(tmp_path), "name": name,
                    "checkpoint_every": 10, "view_every": 2, **trainer},
    }


def _learning(run: Path) -> list[dict[str, float]]:
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "cpu/"))} for m in read_jsonl_records(run / "metrics.jsonl")]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next((latest_checkpoint(run) / "model").glob("*.safetensors"))))


def test_zero_steps_off_is_the_synchronous_run(tmp_path):
    plain = hp_agent.train(_config(tmp_path, "plain", steps=2), progress=False).run_dir
    zero = hp_agent.train(_config(tmp_path, "zero", steps=2, off_policy_steps=0), progress=False).run_dir
    assert _learning(zero) == _learning(plain)
    assert not any(key.startswith("async/") or key.startswith("time/wait") for m in read_jsonl_records(zero / "metrics.jsonl")
                   for key in m)
    one, other = _weights(plain), _weights(zero)
    assert all(torch.equal(one[k], other[k]) for k in one)
    assert [(t["step"], t["policy_version"]) for t in read_jsonl_records(zero / "trajectories.jsonl")] == [(0, 0)] * 2 + [(1, 1)] * 2


@pytest.mark.parametrize("algo", ["hp-rlvr", "grpo"])
def test_one_step_off_trains_step_t_on_the_batch_of_step_t_minus_1s_weights(tmp_path, algo):
    run = hp_agent.train(_config(tmp_path, algo, algo, steps=3, off_policy_steps=1), progress=False).run_dir
    group = 4 if algo == "grpo" else 1
    versions = [(t["step"], t["policy_version"]) for t in read_jsonl_records(run / "trajectories.jsonl")]
    assert versions == [(0, 0)] * 2 * group + [(1, 0)] * 2 * group + [(2, 1)] * 2 * group
    metrics = read_jsonl_records(run / "metrics.jsonl")
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 1.0]  # the learner's version minus the batch's
    assert all(m["time/wait_rollout"] >= 0 and m["time/total"] >= m["time/wait_rollout"] for m in metrics)
    assert all(m["time/wait_learner"] >= 0 for m in metrics[1:])
    # 2 prompts, 1 a mini-batch: the batch's behaviour log-probs were replayed, ratios are not taken as 1
    assert all(m["loss/ratio_max"] != 1.0 for m in metrics)
    views = read_jsonl_records(run / "credit_views.jsonl")  # steps 0 and 2, credit filled in by the learner
    assert sorted({v["step"] for v in views}) == [0, 2]
    assert all(token["credit"] is not None for v in views for turn in v["turns"] for token in turn["tokens"])


def test_the_rollout_process_scores_with_the_weights_handed_over(tmp_path):
    """Each batch is scored by the weights it was generated with: those published as its version."""
    config = load_config(overrides=["env.name=keys", "trainer.prompts_per_step=2", "rollout.max_new_tokens=5",
                                    "rollout.max_turns=3", "trainer.off_policy_steps=1"])
    policy = load_policy("tiny")
    options = ScoringOptions.from_config(config)
    rollouts = RolloutProcess(config, SINGLE, config.model)
    try:
        rollouts.start(policy, 0, hindsight=True, replay=False)
        rollouts.submit(RolloutJob(0, rollouts.task_ids[:2], first_seed=0, version=0))
        first = rollouts.receive(PhaseTimes())
        before = {k: v.clone() for k, v in policy.model.state_dict().items()}
        with torch.no_grad():
            for parameter in policy.model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        rollouts.publish(1)
        rollouts.submit(RolloutJob(1, rollouts.task_ids[:2], first_seed=0, version=1))
        second = rollouts.receive(PhaseTimes())
    finally:
        rollouts.close()
    assert (first.version, second.version) == (0, 1)
    assert all(t.policy_version == 1 for t in second.trajectories)
    new = score_trajectories(policy, second.kept, options, with_hindsight=True)
    assert all(torch.allclose(a, b, atol=1e-5) for s, n in zip(second.scores, new) for a, b in zip(s.causal_logprobs, n.causal_logprobs))
    assert all(torch.allclose(a, b, atol=1e-5) for s, n in zip(second.scores, new) for a, b in zip(s.weights, n.weights))
    policy.model.load_state_dict(before)
    old = score_trajectories(policy, first.kept, options, with_hindsight=True)
    assert all(torch.allclose(a, b, atol=1e-5) for s, o in zip(first.scores, old) for a, b in zip(s.causal_logprobs, o.causal_logprobs))
    stale = score_trajectories(policy, second.kept, options, with_hindsight=True)
    assert not all(torch.allclose(a, b, atol=1e-3) for s, o in zip(second.scores, stale)
                   for a, b in zip(s.causal_logprobs, o.causal_logprobs))


@pytest.mark.parametrize("algo, share", [("hp-rlvr", 0.5), ("hp-rlvr", 1.0), ("grpo", 0.5)])
def test_the_learner_scoring_its_share_gives_the_same_run(tmp_path, algo, share):
    """learner_scoring_share scores that share of each batch with the slot of the generating
    version in the trainer's process: the same scores, credit, views and weights as the
    rollout process's scoring alone (and not if the slot went unread)."""
    runs = {name: hp_agent.train(_config(tmp_path, name, algo, steps=3, off_policy_steps=1, learner_scoring_share=f),
                                 progress=False).run_dir for name, f in (("rollout", 0.0), ("learner", share))}
    # equal up to float rounding: the same kernels, on another process's memory
    learner, rollout = _learning(runs["learner"]), _learning(runs["rollout"])
    assert [m.keys() for m in learner] == [m.keys() for m in rollout]
    assert all(m[k] == pytest.approx(r[k], rel=1e-4, abs=1e-6) for m, r in zip(learner, rollout) for k in m)
    one, other = _weights(runs["rollout"]), _weights(runs["learner"])
    assert all(torch.allclose(one[k], other[k], atol=1e-4) for k in one)  # Adam: rounding-level gradients, lr-sized steps
    views = {side: read_jsonl_records(run / "credit_views.jsonl") for side, run in runs.items()}
    assert len(views["learner"]) == len(views["rollout"]) > 0
    for mine, theirs in zip(views["learner"], views["rollout"]):
        assert mine["step"] == theirs["step"] and mine.keys() == theirs.keys()


def test_two_steps_off_follows_the_same_rule(tmp_path):
    run = hp_agent.train(_config(tmp_path, "two", steps=4, off_policy_steps=2, views_per_step=0), progress=False).run_dir
    versions = [(t["step"], t["policy_version"]) for t in read_jsonl_records(run / "trajectories.jsonl")]
    assert versions == [(0, 0)] * 2 + [(1, 0)] * 2 + [(2, 0)] * 2 + [(3, 1)] * 2
    assert [m["async/staleness"] for m in read_jsonl_records(run / "metrics.jsonl")] == [0.0, 1.0, 2.0, 2.0]


@pytest.mark.parametrize("value", ["-1", "1.5", "two"])
def test_a_bad_value_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="trainer.off_policy_steps"):
        load_config(overrides=[f"trainer.off_policy_steps={value}"])


def test_one_step_off_takes_the_vllm_backend_but_not_its_sleep_mode():
    """The rollout process owns the engine (tests/test_vllm_backend.py runs it); sleeping it
    frees nothing while the learner trains beside it."""
    assert load_config(overrides=["trainer.off_policy_steps=1", "model.backend=vllm"]).model.backend == "vllm"
    with pytest.raises(ConfigError, match=r"model.vllm.sleep=true .* trainer.off_policy_steps=1"):
        load_config(overrides=["trainer.off_policy_steps=1", "model.backend=vllm", "model.vllm.sleep=true"])


def test_an_error_in_the_rollout_process_is_raised_by_the_trainer(tmp_path):
    config = {**_config(tmp_path, "broken", off_policy_steps=1), "env": {"name": "no-such-env"}}
    with pytest.raises(UserError, match="unknown env 'no-such-env'"):
        hp_agent.train(config, progress=False)


def _children(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def test_a_killed_run_resumes_playing_each_step_once(tmp_path):
    """SIGKILL after the first checkpoint (step 2), with the next step's batch in flight: the
    orphaned rollout process exits by itself; the resumed run plays that step's tasks again
    (by the checkpoint's weights) and every step's tasks are those of the seeded task order,
    each trained once."""
    overrides = ["--env", "keys", "--steps", "4", f"trainer.run_dir={tmp_path}", "trainer.name=killed",
                 "trainer.prompts_per_step=2", "trainer.checkpoint_every=2", "trainer.views_per_step=0",
                 "rollout.max_new_tokens=5", "rollout.max_turns=3", "learner.lr=1e-3", "trainer.off_policy_steps=1"]
    process = subprocess.Popen([sys.executable, "-m", "hp_agent", "train", *overrides],
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run = tmp_path / "killed"
    deadline = time.monotonic() + 300
    while (latest_checkpoint(run) is None and process.poll() is None and time.monotonic() < deadline):
        time.sleep(0.02)
    rollout_processes = _children(process.pid)
    running = process.poll() is None
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert running, process.stderr.read().decode()[-2000:]
    assert rollout_processes
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and "zombie" not in _status(pid) for pid in rollout_processes):
        assert time.monotonic() < deadline, "the rollout process outlived its killed trainer"
        time.sleep(0.2)

    killed_at = int(latest_checkpoint(run).name.split("_")[1])
    summary = hp_agent.train(resume=run, progress=False)
    assert summary.steps == 4
    trajectories = read_jsonl_records(run / "trajectories.jsonl")
    assert Counter(t["step"] for t in trajectories) == {step: 2 for step in range(4)}  # each step trained once
    order = TaskSampler(make("keys").task_ids(), 0)
    expected = [order.take(2) for _ in range(4)]
    assert [[t["task_id"] for t in trajectories if t["step"] == step] for step in range(4)] == expected
    versions = [{t["policy_version"] for t in trajectories if t["step"] == step} for step in range(4)]
    # before the kill: one step behind; step killed_at (in flight at the kill) again, by the checkpoint's weights
    expected_versions = [{max(step - 1, 0)} for step in range(killed_at)] + [{killed_at}]
    expected_versions += [{max(step - 1, killed_at)} for step in range(killed_at + 1, 4)]
    assert versions == expected_versions


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return "zombie"


@pytest.mark.parametrize("parallel, share", [("ddp", 0.0), pytest.param("fsdp2", 0.5, marks=pytest.mark.exhaustive)])
def test_two_ranks_each_with_a_rollout_process(tmp_path, parallel, share):
    """Each rank hands its weights (FSDP2: the full ones, gathered) to a rollout process of its
    own (and, with a learner scoring share, to its own scoring copy)."""
    command = [sys.executable, "-m", "hp_agent", "train", "--nproc", "2", "--env", "keys", "--steps", "3",
               f"trainer.run_dir={tmp_path}", "trainer.name=ddp", "trainer.prompts_per_step=4", "trainer.views_per_step=0",
               "rollout.max_new_tokens=5", "rollout.max_turns=3", "learner.lr=1e-3", "trainer.off_policy_steps=1",
               f"learner.parallel={parallel}", f"trainer.learner_scoring_share={share}"]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    trajectories = read_jsonl_records(tmp_path / "ddp" / "trajectories.jsonl")
    assert [(t["step"], t["policy_version"]) for t in trajectories] == [(0, 0)] * 4 + [(1, 0)] * 4 + [(2, 1)] * 4
    assert [m["async/staleness"] for m in read_jsonl_records(tmp_path / "ddp" / "metrics.jsonl")] == [0.0, 1.0, 1.0]


def test_the_gpu_checks_one_step_off_settings_run_on_cpu(tmp_path):
    """scripts/gpu_check.sh's one-step-off run (LoRA r=16, activation checkpointing, the
    learner scoring half) on the tiny model: the adapter's weights are what cross the slots."""
    config = _config(tmp_path, "gpu", steps=3, off_policy_steps=1, learner_scoring_share=0.5)
    config["model"] = {"lora_rank": 16}
    config["learner"]["activation_checkpointing"] = True
    run = hp_agent.train(config, progress=False).run_dir
    trajectories = read_jsonl_records(run / "trajectories.jsonl")
    assert [(t["step"], t["policy_version"]) for t in trajectories] == [(0, 0)] * 2 + [(1, 0)] * 2 + [(2, 1)] * 2
    assert (latest_checkpoint(run) / "model" / "adapter_model.safetensors").is_file()
