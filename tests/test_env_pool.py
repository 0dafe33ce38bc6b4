"""Env pools: an env that raises ends only its own episode, in either pool; in the worker
pool one that crashes its worker or hangs does too, the worker is restarted, and no
process outlives the pool. Tests of what both pools share take the ``num_workers``
fixture and run once per implementation."""

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # pytest's default import mode puts tests/ there already
    sys.path.insert(0, HERE)

import pool_envs  # noqa: E402  (workers import it by the spec below; they inherit sys.path)

from hp_agent.envs import make  # noqa: E402
from hp_agent.envs.pool import EnvError, LocalPool, WorkerPool, make_env_pool  # noqa: E402
from hp_agent.errors import UserError  # noqa: E402
from hp_agent.policies import SamplingParams  # noqa: E402
from hp_agent.rollout import Episode, PhaseTimes, collect  # noqa: E402

SCRIPTED = f"{pool_envs.__name__}:ScriptedEnv"
GROWING = f"{pool_envs.__name__}:GrowingTurnsEnv"
GREEDY = SamplingParams(max_new_tokens=6, greedy=True)
MATH = {"split": "test", "num_tasks": 8}


@pytest.fixture(params=[0, 2], ids=["in-process", "workers"])
def num_workers(request) -> int:
    return request.param


def _alive(pid: int) -> bool:
    try:
        import psutil

        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except ImportError:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False
    except Exception:  # psutil.NoSuchProcess: gone between the two calls
        return False


def _play(policy, pool, tasks, **kwargs):
    return collect(policy, pool, "scripted", [Episode(t, g) for g, t in enumerate(tasks)], GREEDY, **kwargs)


def test_worker_pool_plays_exactly_like_in_process(tiny_policy):
    envs = [make("math", **MATH) for _ in range(3)]
    episodes = [Episode(task_id, group) for group, task_id in enumerate(envs[0].task_ids()[:5])]  # 2 waves
    tiny_policy.prefix_cache.clear()  # both runs start cold: reused keys differ in the last float bits
    in_process = collect(tiny_policy, envs, "math", episodes, GREEDY, seed=7)
    tiny_policy.prefix_cache.clear()
    with make_env_pool("math", 3, num_workers=2, env_kwargs=MATH) as pool:
        local = make_env_pool(envs)
        assert (pool.task_ids(), pool.system_prompt, pool.max_turns, pool.reward_bounds) == (
            local.task_ids(), local.system_prompt, local.max_turns, local.reward_bounds)
        times = PhaseTimes()
        in_workers = collect(tiny_policy, pool, "math", episodes, GREEDY, seed=7, times=times)
    assert [t.to_dict() for t in in_workers] == [t.to_dict() for t in in_process]
    assert [t.task_id for t in in_workers] == [e.task_id for e in episodes]
    assert not any(t.errored for t in in_workers) and all(len(t.turns) == 1 for t in in_workers)
    assert times.seconds["time/env_step"] > 0 and times.seconds["time/generation"] > 0


def test_an_env_that_raises_errors_only_its_episode(tiny_policy, num_workers):
    with make_env_pool(SCRIPTED, 4, num_workers=num_workers) as pool:
        trajectories = _play(tiny_policy, pool, ["ok-0", "raise", "two-steps", "ok-1"])
        assert pool.restarts == 0
    assert [t.errored for t in trajectories] == [False, True, False, False]
    assert trajectories[1].info["error"] == "RuntimeError: boom in step" and "pool_envs.py" in trajectories[1].info["traceback"]
    assert len(trajectories[1].turns) == 1  # the generated turn is kept
    assert [len(t.turns) for t in trajectories] == [1, 1, 2, 1] and trajectories[2].success


def test_an_env_that_raises_at_reset_errors_only_its_episode(tiny_policy, num_workers):
    with make_env_pool(SCRIPTED, 3, num_workers=num_workers) as pool:
        trajectories = _play(tiny_policy, pool, ["ok-0", "raise-at-reset", "two-steps"])
        assert pool.restarts == 0
    assert [t.errored for t in trajectories] == [False, True, False]
    assert trajectories[1].info["error"] == "RuntimeError: boom in reset" and trajectories[1].turns == []
    assert trajectories[0].success and trajectories[2].success


def test_max_turns_is_the_most_any_env_allows(tiny_policy, num_workers):
    """Rollout plays a wave for ``pool.max_turns`` turns, so a pool must not report env 0's
    limit when another env allows more: its episodes would be cut off."""
    with make_env_pool(GROWING, 4, num_workers=num_workers) as pool:
        assert isinstance(pool, WorkerPool if num_workers else LocalPool)
        allowed = [info["max_turns"] for _, info in pool.reset_many([(slot, 0, None) for slot in range(4)])]
        assert allowed[0] < max(allowed)  # the envs differ: env 0's figure is not the most
        assert pool.max_turns == max(allowed)
        trajectories = _play(tiny_policy, pool, ["two-steps"] * 4)  # env 0 of a worker allows 1 turn
    assert all(t.success and len(t.turns) == 2 for t in trajectories)


def test_calls_are_checked_and_the_factory_its_arguments(num_workers):
    with make_env_pool(SCRIPTED, 2, num_workers=num_workers) as pool:
        with pytest.raises(IndexError, match="slot 2 is out of range for a pool of 2 envs"):
            pool.step_many([(2, "a")])
    with pytest.raises(RuntimeError, match="this EnvPool is closed"):
        pool.reset_many([(0, 0, None)])
    with pytest.raises(ValueError, match="at least one env slot"):
        make_env_pool(SCRIPTED, 0, num_workers=num_workers)
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        make_env_pool(SCRIPTED, 2, num_workers=-1)
    with pytest.raises(ValueError, match="runs in-process"):
        make_env_pool([pool_envs.ScriptedEnv()], num_workers=1)


def test_a_crashed_worker_is_restarted_and_the_next_wave_works(tiny_policy):
    with make_env_pool(SCRIPTED, 4, num_workers=2) as pool:
        before = pool.worker_pids()
        trajectories = _play(tiny_policy, pool, ["ok-0", "ok-1", "exit", "ok-2"])
        # slots 2 and 3 live on worker 1: the crash fails both requests it held
        assert [t.errored for t in trajectories] == [False, False, True, True]
        assert trajectories[2].info["error"].startswith("WorkerDied: env worker 1") and "exited with code 1" in trajectories[2].info["error"]
        assert "not run" in trajectories[3].info["error"]
        assert pool.restarts == 1 and pool.worker_pids()[0] == before[0] and pool.worker_pids()[1] != before[1]
        assert not _alive(before[1])
        again = _play(tiny_policy, pool, ["ok-0", "ok-1", "ok-2", "two-steps"])
        assert not any(t.errored for t in again) and all(t.success for t in again)


def test_a_hung_env_times_out_and_its_worker_is_replaced(tiny_policy):
    with make_env_pool(SCRIPTED, 2, num_workers=2, step_timeout=1.0) as pool:
        started = time.monotonic()
        trajectories = _play(tiny_policy, pool, ["hang", "ok-0"])
        assert time.monotonic() - started < 30
        assert trajectories[0].errored and trajectories[0].info["error"].startswith("EnvTimeout: step on slot 0 took longer than 1 s")
        assert not trajectories[1].errored and trajectories[1].success
        assert pool.restarts == 1
        assert not any(t.errored for t in _play(tiny_policy, pool, ["ok-0", "ok-1"]))


def test_restarted_slots_refuse_steps_until_reset_and_no_process_is_left():
    seen = set()
    with make_env_pool(SCRIPTED, 4, num_workers=2) as pool:
        seen.update(pool.worker_pids())
        pool.reset_many([(2, 0, {"task_id": "two-steps"}), (3, 0, {"task_id": "exit"})])  # both on worker 1
        first, crashed = pool.step_many([(2, "a"), (3, "b")])
        assert first[:4] == ("once more", 0.0, False, False)  # answered before the crash: kept
        assert isinstance(crashed, EnvError) and crashed.type == "WorkerDied"
        (lost,) = pool.step_many([(2, "c")])  # the rebuilt env lost the episode in flight
        assert isinstance(lost, EnvError) and lost.type == "EnvStateLost"
        pool.reset_many([(2, 0, {"task_id": "ok-3"})])
        assert pool.step_many([(2, "d")])[0][1] == 1.0
        seen.update(pool.worker_pids())
        processes = [w.process for w in pool._workers]
    assert len(seen) == 3 and not any(_alive(pid) for pid in seen)
    assert not set(processes) & set(multiprocessing.active_children())


def test_slots_come_in_blocks_and_batches_spread_evenly():
    with make_env_pool(SCRIPTED, 7, num_workers=2) as pool:
        assert [pool.worker_slots(w) for w in (0, 1)] == [range(0, 4), range(4, 7)]
        assert pool.balanced_slots(7) == list(range(7))
        assert pool.balanced_slots(5) == [0, 1, 2, 4, 5]  # 3 + 2, neighbours together
        assert pool.balanced_slots(1) == [0]
        with pytest.raises(ValueError, match="between 1 and num_envs=7"):
            pool.balanced_slots(8)
        # Each slot answers from its own env, wherever it lives.
        results = pool.reset_many([(slot, 0, {"task_id": pool_envs.TASKS[slot]}) for slot in range(7)])
        assert [r[0] for r in results] == [f"task {task}" for task in pool_envs.TASKS[:7]]
    with make_env_pool(SCRIPTED, 3) as local:
        assert local.balanced_slots(2) == [0, 1] and local.worker_slots(0) == range(3)


def test_a_call_interrupted_by_ctrl_c_leaves_a_usable_pool():
    def interrupt(*_):
        raise KeyboardInterrupt

    with make_env_pool(SCRIPTED, 2, num_workers=1) as pool:
        pool.reset_many([(0, 0, {"task_id": "hang"}), (1, 0, {"task_id": "ok-0"})])
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(KeyboardInterrupt):
                pool.step_many([(0, "a"), (1, "b")])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        results = pool.reset_many([(0, 0, {"task_id": "ok-1"}), (1, 0, {"task_id": "ok-2"})])
        assert [r[0] for r in results] == ["task ok-1", "task ok-2"] and pool.restarts == 1
        assert [r[1] for r in pool.step_many([(0, "a"), (1, "b")])] == [1.0, 1.0]


def test_in_process_pool_and_start_errors():
    with make_env_pool(SCRIPTED, 2) as pool:  # num_workers=0: same API, no processes
        pool.reset_many([(0, 0, {"task_id": "raise"}), (1, 0, {"task_id": "ok-0"})])
        error, ok = pool.step_many([(0, "a"), (1, "b")])
        assert isinstance(error, EnvError) and error.type == "RuntimeError" and ok[2] is True
        assert pool.worker_pids() == []
    # a bad argument met in a worker is the user's mistake: the env's own one line, no traceback
    with pytest.raises(UserError, match="^unknown split 'nope'") as error:
        make_env_pool("math", 2, num_workers=1, env_kwargs={"split": "nope"})
    assert not isinstance(error.value, RuntimeError) and "\n" not in str(error.value)


def test_workers_exit_when_the_parent_dies():
    script = (
        "import os, signal, sys\n"
        "from hp_agent.envs.pool import make_env_pool\n"
        f"pool = make_env_pool({SCRIPTED!r}, 2, num_workers=2)\n"
        "print(*pool.worker_pids(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)
