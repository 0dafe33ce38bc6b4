"""Data parallel on torch.distributed (gloo, two CPU processes under torchrun): a step on
two ranks is the step one process takes on the same global batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hp_agent.credit.registry import credit_rule
from hp_agent.distributed import SINGLE, Ranks, shard
from hp_agent.files import read_jsonl_records
from hp_agent.hindsight import ScoringOptions, score_trajectories
from hp_agent.policies import SamplingParams, load_policy
from hp_agent.rollout import Episode, collect
from hp_agent.run_folder import checkpoint_damage

sys.path.insert(0, str(Path(__file__).parent))
from pool_envs import TiedOrNot  # noqa: E402

pytestmark = pytest.mark.slow
STEP = Path(__file__).parent / "dist_step.py"


def _fixed_batch(tmp_path: Path, algo: str) -> Path:
    """8 real trajectories of the tiny model (2 prompts x 4, rewards 1,1,1,1 and 0,1,0,1)
    and their scores, saved for every process to read."""
    group_size = 4
    policy = load_policy("tiny")
    episodes = [Episode(task, group=g) for g, task in enumerate(["tied", "split"]) for _ in range(group_size)]
    envs = [TiedOrNot() for _ in episodes]
    torch.manual_seed(0)
    trajectories = collect(policy, envs, "tied-or-not", episodes, SamplingParams(max_new_tokens=6), 1, seed=0)
    scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=credit_rule(algo).hindsight)
    path = tmp_path / "batch.pt"
    torch.save({"trajectories": trajectories, "scores": scores, "algo": algo}, path)
    return path


def _run(command: list[str], out: Path) -> None:
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("algo", ["hp-rlvr", pytest.param("grpo", marks=pytest.mark.exhaustive)])  # grpo: make test-exhaustive
def test_two_ranks_take_the_step_one_process_takes(tmp_path, algo):
    """With DDP, and with FSDP2 (the GRPO case with activation checkpointing too)."""
    batch = _fixed_batch(tmp_path, algo)
    _run([sys.executable, str(STEP), str(batch), str(tmp_path / "one")], tmp_path / "one")
    one = torch.load(tmp_path / "one" / "rank0.pt", weights_only=False)
    start = load_policy("tiny").model.state_dict()
    for parallel in ("ddp", "fsdp2"):
        checkpointing = "1" if parallel == "fsdp2" and algo == "grpo" else "0"
        out = tmp_path / parallel
        _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(STEP), str(batch),
              str(out), parallel, checkpointing], out)
        rank0, rank1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1))
        # Two ranks sum gradients in another order than one process, and AdamW's first step moves
        # a weight by lr * g / (|g| + eps): where |g| is near eps the rounding reaches the weights.
        # Measured up to 6.5e-6 (DDP and FSDP2 alike, GRPO's k_proj), against 1.6e-3 a step.
        tolerance = 1e-5
        # 8 trajectories in mini-batches of 3: the second one spans both ranks.
        assert len(one["grad_norms"]) == len(rank0["grad_norms"]) == len(rank1["grad_norms"]) == 3
        assert rank0["grad_norms"] == pytest.approx(one["grad_norms"], rel=1e-4), parallel
        assert rank0["losses"] == pytest.approx(one["losses"], rel=1e-4, abs=1e-7), parallel
        moved = 0
        for name, weight in one["weights"].items():
            assert torch.equal(rank0["weights"][name], rank1["weights"][name]), (parallel, name)  # ranks in lockstep
            assert torch.allclose(rank0["weights"][name], weight, atol=tolerance), (parallel, name)
            moved += int(not torch.equal(weight, start[name]))
        assert moved > 0  # the step changed the model, so equality says something
        assert rank0["baseline"] == rank1["baseline"] == one["baseline"]


def test_fsdp2_in_bf16_mixed_precision_takes_about_the_autocast_step_of_one_process(tmp_path):
    """FSDP2 casts each unit's weights to bf16, autocast casts each op's inputs: the same
    precision, rounded in other places, so the two agree to bf16's resolution only."""
    batch = _fixed_batch(tmp_path, "hp-rlvr")
    _run([sys.executable, str(STEP), str(batch), str(tmp_path / "one"), "ddp", "0", "1"], tmp_path / "one")
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(STEP), str(batch),
          str(tmp_path / "two"), "fsdp2", "1", "1"], tmp_path / "two")
    one, two = (torch.load(tmp_path / out / "rank0.pt", weights_only=False) for out in ("one", "two"))
    assert two["grad_norms"] == pytest.approx(one["grad_norms"], rel=2e-2)  # measured: within 0.3%
    assert two["losses"] == pytest.approx(one["losses"], rel=2e-2)
    assert all(weight.dtype == torch.float32 for weight in two["weights"].values())  # the rollout model's dtype
    # AdamW turns rounding in near-zero gradients into whole steps of some weights, so compare
    # the updates as vectors: measured cosine 0.998, norms 3.5804 and 3.5806.
    start = load_policy("tiny").model.state_dict()
    updates = [torch.cat([(run["weights"][k] - start[k]).flatten() for k in start]) for run in (one, two)]
    assert torch.nn.functional.cosine_similarity(*updates, dim=0) > 0.99
    assert float(updates[1].norm()) == pytest.approx(float(updates[0].norm()), rel=1e-2)


def _train_command(tmp_path: Path, name: str, *arguments: str) -> list[str]:
    return [sys.executable, "-m", "hp_agent", "train", "--nproc", "2", "--env", "keys", "--steps", "2",
            f"trainer.run_dir={tmp_path}", f"trainer.name={name}", "trainer.prompts_per_step=4",
            "trainer.checkpoint_every=1", "rollout.max_new_tokens=5", "learner.lr=1e-3", "learner.mini_batch_prompts=3",
            *arguments]


def _train(tmp_path: Path, name: str, *arguments: str) -> Path:
    done = subprocess.run(_train_command(tmp_path, name, *arguments), env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return tmp_path / name


def _train_and_kill(tmp_path: Path, name: str, *arguments: str) -> Path:
    """Start a run and SIGKILL torchrun and both ranks as soon as its first checkpoint is
    complete, while the second step is in flight."""
    run = tmp_path / name
    first, second = run / "checkpoints" / "step_000001" / "state.pt", run / "checkpoints" / "step_000002"
    process = subprocess.Popen(_train_command(tmp_path, name, *arguments), env={**os.environ, "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    running = process.poll() is None and not second.exists()
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert running, "the run ended before it could be killed mid-run"
    return run


def _step_metrics(run: Path, step: int) -> dict[str, float]:
    record = read_jsonl_records(run / "metrics.jsonl")[step]
    return {k: v for k, v in record.items() if not k.startswith(("time/", "cpu/"))}


@pytest.mark.parametrize("parallel", [pytest.param(p, marks=pytest.mark.exhaustive) for p in ("ddp", "fsdp2")])  # ~100 s each
def test_two_rank_run_writes_one_folder_and_resumes_after_a_kill_to_the_same_metrics(tmp_path, parallel):
    setting = f"learner.parallel={parallel}"
    whole = _train(tmp_path, "whole", setting)
    learner_files = (["manifest.json", "model", "optimizer.pt", "state.pt"] if parallel == "ddp"
                     else ["learner", "manifest.json", "model", "state.pt"])
    assert sorted(p.name for p in whole.iterdir() if not p.name.startswith("events.")) == [
        "checkpoints", "config.yaml", "credit_views.jsonl", "grad_norms.jsonl", "metrics.jsonl", "trajectories.jsonl"]
    trajectories = read_jsonl_records(whole / "trajectories.jsonl")
    assert [t["step"] for t in trajectories] == [0] * 4 + [1] * 4  # both ranks' episodes, logged once
    assert [c.name for c in sorted((whole / "checkpoints").glob("step_*"))] == ["step_000001", "step_000002"]
    assert sorted(p.name for p in (whole / "checkpoints" / "step_000002").iterdir()) == learner_files
    state = torch.load(whole / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert len(state["rng"]) == 2  # each rank's generators, to resume each where it stopped
    assert checkpoint_damage(whole / "checkpoints" / "step_000002") is None  # the shards match rank 0's manifest

    killed = _train_and_kill(tmp_path, "killed", setting)
    _train(tmp_path, "unused", "--resume", str(killed))
    assert not (tmp_path / "unused").exists()
    assert [r["step"] for r in read_jsonl_records(killed / "metrics.jsonl")] == [0, 1]
    for step in (0, 1):
        assert _step_metrics(killed, step) == pytest.approx(_step_metrics(whole, step), rel=1e-5, abs=1e-7), step


def test_shard_is_contiguous_and_refuses_an_uneven_split():
    items = list(range(6))
    assert [shard(items, Ranks(r, 2)) for r in (0, 1)] == [[0, 1, 2], [3, 4, 5]]
    assert shard(items, SINGLE) == items
    with pytest.raises(ValueError, match="6 items do not split evenly over 4 ranks"):
        shard(items, Ranks(0, 4))
