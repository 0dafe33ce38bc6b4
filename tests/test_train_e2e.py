"""End to end on the tiny model: both algorithms, the run folder, eval, resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

import hp_agent
from hp_agent.files import read_jsonl_records
from hp_agent.run_folder import latest_checkpoint, model_source

pytestmark = pytest.mark.slow

PHASES = ["time/generation", "time/env_step", "time/train", "time/weight_sync", "time/residual", "time/total"]


def _config(tmp_path, algo, steps=2, **trainer):
    return {
        "env": {"name": "math"},
        "algo": {"name": algo, **({"group_size": 4} if algo == "grpo" else {})},
        "rollout": {"max_new_tokens": 24},
        "learner": {"lr": 1e-4},
        "trainer": {"steps": steps, "prompts_per_step": 2, "run_dir": str(tmp_path), "name": algo, "checkpoint_every": 1, **trainer},
    }


@pytest.mark.parametrize("algo", ["hp-rlvr", "grpo"])
def test_two_steps_write_a_complete_run_folder(tmp_path, algo):
    summary = hp_agent.train(_config(tmp_path, algo), progress=False)
    run = summary.run_dir
    assert summary.steps == 2
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["algo"]["name"] == algo and config["hindsight"]["future_turns"] == 8  # defaults recorded
    metrics = read_jsonl_records(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    phase = "time/hindsight" if algo == "hp-rlvr" else "time/replay"
    for record in metrics:
        assert all(record[key] >= 0 for key in PHASES + [phase])
        assert record["time/total"] >= record[phase]
        if algo == "grpo":  # 2 x 4 trajectories, one optimizer step: no replay, the learner's own pass (ratio 1)
            assert record["loss/ratio_max"] == record["loss/ratio_mean"] == 1.0
    grads = read_jsonl_records(run / "grad_norms.jsonl")
    # one optimizer step (2 prompts <= 8 a mini-batch) and one record (2 x G <= 8 slots) a step
    assert [(g["step"], g["optimizer_step"], g["record"]) for g in grads] == [(0, 0, 0), (1, 0, 0)]
    assert [(m["train/optimizer_steps"], m["train/grad_records"]) for m in metrics] == [(1, 1), (1, 1)]
    assert summary.grad_records == 2
    trajectories = read_jsonl_records(run / "trajectories.jsonl")
    assert len(trajectories) == 2 * 2 * (4 if algo == "grpo" else 1)
    assert list(run.glob("events.out.tfevents.*"))
    checkpoint = latest_checkpoint(run)
    assert checkpoint.name == "step_000002" and (checkpoint / "model" / "config.json").is_file()
    result = hp_agent.evaluate(env="math", model=str(run), split="test", samples=2, limit=3)
    assert result.tasks == 3 and result.samples == 2
    assert model_source(str(run)) == str(checkpoint / "model")  # a run folder evaluates its last weights


def test_grpo_gives_a_tied_group_zero_gradients_and_a_split_group_none(tmp_path):
    """One step of 2 prompts, one optimizer step with one rollout slot per record: HP-RLVR
    logs 2 records, GRPO (G=4) 8; exactly the tied group's 4 records have a zero gradient (a group
    normalised against the batch, not itself, would give none)."""
    from pool_envs import TiedOrNot  # tests/ is on sys.path

    hp_agent.register("tied-or-not", TiedOrNot, overwrite=True)
    learner = {"lr": 1e-4, "record_batch_size": 1}
    runs = {}
    for algo in ("hp-rlvr", "grpo"):
        config = {**_config(tmp_path, algo, steps=1), "learner": learner}
        config["env"] = {"name": "tied-or-not"}
        runs[algo] = hp_agent.train(config, progress=False)
    assert (runs["hp-rlvr"].grad_records, runs["grpo"].grad_records) == (2, 8)
    trajectories = read_jsonl_records(runs["grpo"].run_dir / "trajectories.jsonl")
    rewards = {task: sorted(t["reward"] for t in trajectories if t["task_id"] == task) for task in ("tied", "split")}
    assert rewards == {"tied": [1.0] * 4, "split": [0.0, 0.0, 1.0, 1.0]}
    assert runs["grpo"].zero_grad_records == 4


def _wait_for(predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_resume_after_kill_loses_at_most_the_step_in_flight(tmp_path):
    overrides = [
        "env.name=math", "trainer.steps=5", "trainer.prompts_per_step=2", "trainer.checkpoint_every=1", f"trainer.run_dir={tmp_path}",
        "trainer.name=killed", "rollout.max_new_tokens=16", "learner.lr=1e-4",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "hp_agent.cli", "train", *overrides], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run = tmp_path / "killed"
    reached = _wait_for(lambda: (c := latest_checkpoint(run)) is not None and c.name >= "step_000002", timeout=240)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert reached, process.stderr.read().decode()[-2000:]
    killed_at = int(latest_checkpoint(run).name.split("_")[1])
    if killed_at == 5:
        pytest.skip("the run finished before it could be killed")

    summary = hp_agent.train(resume=run, progress=False)
    assert summary.steps == 5
    lines = (run / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]  # every line is valid JSON
    assert steps == [0, 1, 2, 3, 4]
    grad_steps = [r["step"] for r in read_jsonl_records(run / "grad_norms.jsonl")]
    assert grad_steps == [0, 1, 2, 3, 4]
    assert latest_checkpoint(run).name == "step_000005"
    assert len(list((run / "checkpoints").glob("step_*"))) <= 2  # older checkpoints pruned


def test_cli_errors_are_clear(tmp_path, monkeypatch):
    from huggingface_hub import constants
    from typer.testing import CliRunner

    from hp_agent.cli import app

    def run(*args):  # in process: each subprocess would spend seconds importing torch
        result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
        return result.exit_code, " ".join(result.output.split())

    code, out = run("train", "algo.clip_eps=0.2", f"trainer.run_dir={tmp_path}")
    assert code == 2 and "unknown config key 'algo.clip_eps'" in out and "algo.clip_eps_low" in out
    code, out = run("train", "--env", "nope", f"trainer.run_dir={tmp_path}", "trainer.steps=1")
    assert code == 2 and "unknown env 'nope'" in out
    assert not any(tmp_path.iterdir())  # a run that cannot start leaves no run folder behind
    (tmp_path / "taken").write_text("not a run")
    code, out = run("train", "--env", "math", "--name", "taken", f"trainer.run_dir={tmp_path}", "trainer.steps=1")
    assert code == 2 and "is a file" in out and (tmp_path / "taken").read_text() == "not a run"
    (tmp_path / "taken").unlink()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # a hub id is downloaded where online: no network in tests
    code, out = run("train", "--env", "math", "--model", "Qwen/Qwen3-8B-not-cached", f"trainer.run_dir={tmp_path}", "trainer.steps=1")
    assert code == 2 and "--model" in out
    code, out = run("envs")
    assert code == 0 and "math" in out.split()
    code, out = run("sft", "--env", "keystep", "--out", str(tmp_path / "warm"), "--env-kwargs", "{bogus: 1}")
    assert code == 2 and "env 'keystep' has no argument 'bogus'; valid:" in out
    assert not (tmp_path / "warm").exists()


def test_a_run_that_fails_mid_step_leaves_no_worker_process(tmp_path):
    """Env workers and log files are closed when a step raises, not only at the end."""
    import multiprocessing

    from hp_agent.credit.registry import CREDIT_RULES, register_credit

    def failing_rule(batch, options):
        raise RuntimeError("credit rule failed on purpose")

    register_credit("fails-mid-step")(failing_rule)
    config = _config(tmp_path, "hp-rlvr", steps=2)
    config["algo"]["name"] = "fails-mid-step"
    config["env"]["num_workers"] = 2
    before = set(multiprocessing.active_children())
    try:
        with pytest.raises(RuntimeError, match="on purpose"):
            hp_agent.train(config, progress=False)
    finally:
        CREDIT_RULES.pop("fails-mid-step")
    assert set(multiprocessing.active_children()) - before == set()
    assert (tmp_path / "hp-rlvr" / "config.yaml").is_file()  # the folder was made, then the step failed


@pytest.mark.parametrize("env", ["pool_envs:SometimesBroken", "pool_envs:SometimesBrokenSingleStep"])
@pytest.mark.parametrize("algo", ["hp-rlvr", "grpo"])
def test_errored_episodes_never_end_a_run(tmp_path, env, algo):
    """An env whose reset raises and one whose step raises, in a multi-turn and a
    single-step env: the run goes on; those episodes are counted and logged with their
    error, and left out of the reward mean, the baseline and the learner."""
    hp_agent.register("sometimes-broken", env, overwrite=True)
    config = _config(tmp_path, algo, steps=1)
    config["env"] = {"name": "sometimes-broken"}
    config["algo"] = {"name": algo, **({"group_size": 2} if algo == "grpo" else {})}
    config["trainer"]["prompts_per_step"] = 4
    summary = hp_agent.train(config, progress=False)
    group = 2 if algo == "grpo" else 1
    (metrics,) = read_jsonl_records(summary.run_dir / "metrics.jsonl")
    trajectories = read_jsonl_records(summary.run_dir / "trajectories.jsonl")
    errored = [t for t in trajectories if t["errored"]]
    assert len(trajectories) == 4 * group and metrics["rollout/errored"] == len(errored) == 2 * group
    assert {t["task_id"] for t in errored} == {"raise", "raise-at-reset"}
    assert all("boom in" in t["info"]["error"] for t in errored)
    finished = [t["reward"] for t in trajectories if not t["errored"]]
    assert metrics["rollout/reward_mean"] == pytest.approx(sum(finished) / len(finished))
    from hp_agent.runs import load_checkpoint_state

    estimates = load_checkpoint_state(summary.checkpoint)["baseline"]["estimates"]
    assert estimates and not any("raise" in str(key) for key in estimates)
    assert summary.grad_records == metrics["train/grad_records"] >= 1
