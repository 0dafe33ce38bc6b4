"""Envs over OpenEnv's wire protocol: `hp-agent serve` and the env ``openenv``, on 127.0.0.1 only.

Each server is a real `hp-agent serve` process (OpenEnv's FastAPI app under uvicorn, one env
worker process per session), played through OpenEnv's own client, and compared step by step
with the same env built here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="openenv-core is not installed (pip install -e '.[openenv]')")

from websockets.sync.client import connect  # noqa: E402

from hp_agent.envs import make  # noqa: E402
from hp_agent.envs.pool import EnvError, make_env_pool  # noqa: E402
from hp_agent.envs.wire.client import RemoteEnvError  # noqa: E402


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """An `hp-agent serve` process on a free local port."""

    def __init__(self, env: str, env_kwargs: dict, *flags: str):
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "hp_agent", "serve", "--env", env, "--env-kwargs", json.dumps(env_kwargs),
                   "--port", str(self.port), *flags]
        self.process = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
        deadline = time.monotonic() + 240
        while True:
            assert self.process.poll() is None, f"the server exited with {self.process.returncode}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                assert time.monotonic() < deadline, "the server did not answer /health within 240 s"
                time.sleep(0.5)

    def raw(self):
        """A WebSocket session spoken by hand (no OpenEnv client)."""
        return connect(self.url + "/ws", open_timeout=60, max_size=None)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the server and its env workers
            self.process.wait(30)


@pytest.fixture(scope="module")
def keys_server() -> Iterator[Server]:
    server = Server("keys", {}, "--max-sessions", "9")
    yield server
    server.stop()


def first_actions(env, task_id: str, seed: int) -> list[tuple]:
    """Play ``task_id`` taking the first admissible action each turn; each reset and step's result."""
    observation, info = env.reset(seed=seed, options={"task_id": task_id})
    results: list[tuple] = [(observation, info["task_id"], info["admissible_actions"])]
    done = False
    while not done:
        observation, reward, terminated, truncated, info = env.step(info["admissible_actions"][0])
        done = terminated or truncated
        verdict = info.get("verdict")
        results.append((observation, reward, terminated, truncated, info.get("admissible_actions"),
                        info["invalid_action"], verdict and (verdict.reward, verdict.feedback, verdict.success)))
    return results


def test_served_keys_plays_as_the_local_env_step_by_step(keys_server):
    remote, local = make("openenv", url=keys_server.url), make("keys")
    assert (remote.system_prompt, remote.answer_format, remote.max_turns, remote.reward_bounds, remote.task_ids()) == (
        local.system_prompt, local.answer_format, local.max_turns, tuple(local.reward_bounds), local.task_ids())
    for index, task_id in enumerate(local.task_ids()[:4]):
        played = first_actions(remote, task_id, index)
        assert played == first_actions(local, task_id, index) and len(played) > 2
    # an invalid response costs what it costs locally
    for env in (remote, local):
        env.reset(seed=0, options={"task_id": local.task_ids()[0]})
    assert remote.step("no such action")[:4] == local.step("no such action")[:4]
    remote.close()


def test_gymnasium_env_checker_passes_the_remote_env(keys_server):
    from gymnasium.utils.env_checker import check_env

    remote = make("openenv", url=keys_server.url)
    check_env(remote, skip_render_check=True)
    remote.close()


def test_openenvs_own_runtime_validator_passes_the_server(keys_server):
    from openenv.cli._validation import validate_running_environment

    report = validate_running_environment(f"http://127.0.0.1:{keys_server.port}", timeout_s=60)
    assert report["passed"], [c["id"] for c in report["criteria"] if not c["passed"]]
    assert {c["id"] for c in report["criteria"]} >= {"health_endpoint", "metadata_endpoint", "schema_endpoint"}


def test_eight_concurrent_sessions_keep_their_games_apart(keys_server):
    task_ids = make("keys").task_ids()[10:18]
    remotes, locals_ = [make("openenv", url=keys_server.url) for _ in task_ids], [make("keys") for _ in task_ids]
    infos = []
    for remote, local, task_id in zip(remotes, locals_, task_ids):
        remote_start, local_start = remote.reset(seed=1, options={"task_id": task_id}), local.reset(seed=1, options={"task_id": task_id})
        assert remote_start[0] == local_start[0]
        infos.append(local_start[1])
    live = list(range(len(task_ids)))
    while live:  # one step of each session in turn: their states interleave on the server
        for k in list(live):
            action = (infos[k]["admissible_actions"] or ["open"])[-1]
            remote_step, local_step = remotes[k].step(action), locals_[k].step(action)
            assert remote_step[:4] == local_step[:4]
            infos[k] = local_step[4]
            if local_step[2] or local_step[3]:
                live.remove(k)
    for remote in remotes:
        remote.close()


def test_bad_messages_get_an_error_reply_and_the_server_keeps_serving(keys_server):
    with keys_server.raw() as ws:
        ws.send("{not json")
        assert json.loads(ws.recv(timeout=60))["data"]["code"] == "INVALID_JSON"
        ws.send(json.dumps({"type": "dance"}))
        assert json.loads(ws.recv(timeout=60))["data"]["code"] == "UNKNOWN_TYPE"
        ws.send(json.dumps({"type": "step", "data": {"text": "open the red box"}}))  # before any reset
        reply = json.loads(ws.recv(timeout=60))
        assert reply["data"]["code"] == "EXECUTION_ERROR" and "send a reset first" in reply["data"]["message"]
        ws.send(json.dumps({"type": "step", "data": {"txt": "typo"}}))
        assert json.loads(ws.recv(timeout=60))["data"]["code"] in ("VALIDATION_ERROR", "EXECUTION_ERROR")
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))  # the same session still plays
        assert json.loads(ws.recv(timeout=60))["type"] == "observation"
    with keys_server.raw() as ws:  # over the size limit: this connection closes, no other
        ws.send("x" * (2 << 20))
        with pytest.raises(Exception):
            ws.recv(timeout=60)
    remote = make("openenv", url=keys_server.url)
    assert remote.reset(seed=0)[0]
    remote.close()


def test_a_session_over_the_limit_gets_capacity_reached():
    server = Server("keys", {}, "--max-sessions", "2")
    try:
        first, second = server.raw(), server.raw()
        for ws in (first, second):
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=60))["type"] == "observation"
        with server.raw() as third:  # refused as it connects, before it sends anything
            reply = json.loads(third.recv(timeout=60))
        assert reply["type"] == "error" and reply["data"]["code"] == "CAPACITY_REACHED"
        # the client retries with back-off, then says so in one line
        remote = make("openenv", url=server.url, retries=2, backoff=0.1)
        with pytest.raises(RemoteEnvError, match="CAPACITY_REACHED") as refused:
            remote.reset(seed=0)
        assert "\n" not in str(refused.value)
        first.close()
        time.sleep(2)  # the server frees the closed session's env
        assert remote.reset(seed=0)[0]
        remote.close()
        second.close()
    finally:
        server.stop()


def test_an_idle_session_is_closed_and_frees_its_place():
    server = Server("keys", {}, "--max-sessions", "1", "--idle-timeout", "1")
    try:
        idle, waiting = make("openenv", url=server.url), make("openenv", url=server.url, retries=1)
        _, info = idle.reset(seed=0)
        with pytest.raises(RemoteEnvError, match="CAPACITY_REACHED"):
            waiting.reset(seed=0)
        time.sleep(8)  # OpenEnv's reaper looks every 5 s at the least
        assert waiting.reset(seed=0)[0]
        with pytest.raises(RemoteEnvError, match="lost the episode"):
            idle.step(info["admissible_actions"][0])
        waiting.close()
    finally:
        server.stop()


def test_a_server_killed_mid_episode_errors_that_episode_and_the_next_reset_reconnects():
    server = Server("keys", {})
    pool = make_env_pool("openenv", 1, env_kwargs={"url": server.url, "retries": 2, "backoff": 0.2})
    try:
        [start] = pool.reset_many([(0, 0, None)])
        assert not isinstance(start, EnvError)
        server.stop()
        [lost] = pool.step_many([(0, start[1]["admissible_actions"][0])])
        assert isinstance(lost, EnvError) and lost.type == "RemoteEnvError" and "lost the episode" in lost.message
        [refused] = pool.reset_many([(0, 0, None)])
        assert isinstance(refused, EnvError) and "reset failed after 2 tries" in refused.message
    finally:
        pool.close()
        server.stop()


def test_a_missing_server_is_one_line():
    port = free_port()
    with pytest.raises(RemoteEnvError, match=f"no openenv server at http://127.0.0.1:{port}"):
        make("openenv", url=f"ws://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def alfworld_games() -> dict:
    """Six official ID games, one of each task type (served without --privileged)."""
    pytest.importorskip("alfworld", reason="alfworld is not installed (pip install -e '.[alfworld]')")
    from hp_agent.envs.alfworld import data

    root = data.find_data_root()
    if root is None:
        pytest.skip(data.missing_data_message())
    return {"split": "id", "data_root": str(root), "num_games": 6}


@pytest.fixture(scope="module")
def alfworld_server(alfworld_games) -> Iterator[Server]:
    server = Server("alfworld", alfworld_games)
    yield server
    server.stop()


@pytest.mark.slow
def test_served_alfworld_walkthroughs_win_six_official_games_as_locally(alfworld_server, alfworld_games):
    """The walkthrough comes from the local env: the expert's action never crosses the wire."""
    local = make("alfworld", **alfworld_games, walkthrough_info=True)
    remote = make("openenv", url=alfworld_server.url)
    try:
        assert remote.task_ids() == local.task_ids() and remote.action_template == local.action_template
        types = set()
        for task_id in local.task_ids():
            remote_text, remote_info = remote.reset(seed=0, options={"task_id": task_id})
            local_text, local_info = local.reset(seed=0, options={"task_id": task_id})
            assert remote_text == local_text and remote_info["admissible_actions"] == local_info["admissible_actions"]
            assert "expert_action" not in remote_info and "walkthrough" not in remote_info
            types.add(local_info["task_type"])
            for command in local_info["walkthrough"]:
                response = local.action_template.format(action=command)
                remote_step, local_step = remote.step(response), local.step(response)
                assert remote_step[:4] == local_step[:4]
                assert remote_step[4]["admissible_actions"] == local_step[4]["admissible_actions"]
            assert remote_step[2] and remote_step[4]["won"] and remote_step[4]["verdict"] == local_step[4]["verdict"]
        assert len(types) == 6
    finally:
        remote.close()
        local.close()


@pytest.mark.slow
@pytest.mark.parametrize("served", ["keys", "alfworld"])
def test_two_steps_of_hp_rlvr_train_on_a_served_env(served, request, tmp_path):
    import hp_agent

    server = request.getfixturevalue(f"{served}_server")
    summary = hp_agent.train({"env": {"name": f"openenv:{server.url}"}, "model": {"name": "tiny"},
                              "rollout": {"max_new_tokens": 16, "max_turns": 4},
                              "trainer": {"steps": 2, "prompts_per_step": 2, "run_dir": str(tmp_path), "name": "wire"}},
                             progress=False)
    steps = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps] == [0, 1] and summary.steps == 2
    assert all(step["rollout/errored"] == 0 and step["rollout/turns_mean"] > 1 for step in steps)


def test_the_manifest_names_an_app_that_serves_the_env(monkeypatch):
    import importlib

    import yaml

    manifest = yaml.safe_load((Path(__file__).parents[1] / "openenv.yaml").read_text())
    assert (manifest["spec_version"], manifest["runtime"]) == (1, "fastapi")
    module_name, _, attribute = manifest["app"].partition(":")
    monkeypatch.setenv("HP_AGENT_SERVE_ENV", "keystep")
    app = getattr(importlib.import_module(module_name), attribute)
    routes = {route.path for route in app.routes}
    assert {"/ws", "/health", "/schema", "/hp_agent/env"} <= routes


def test_privileged_info_leaves_the_server_only_when_asked():
    from hp_agent.envs.wire.messages import info_of, observation_of
    from hp_agent.verifiers import Verdict

    info = {"task_id": "t", "won": True, "admissible_actions": ["look"], "expert_action": "go to desk 1",
            "walkthrough": ["go to desk 1"], "game_file": Path("/games/t.tw-pddl"), "verdict": Verdict(10.0, "success", True)}
    public = observation_of("You win.", info, 10.0, True, False, privileged=False)
    assert "go to desk 1" not in public.model_dump_json() and public.privileged is None
    received = info_of(json.loads(public.model_dump_json()))
    assert received == {"task_id": "t", "won": True, "admissible_actions": ["look"], "verdict": Verdict(10.0, "success", True)}
    asked = info_of(json.loads(observation_of("You win.", info, 10.0, True, False, privileged=True).model_dump_json()))
    assert (asked["expert_action"], asked["walkthrough"], asked["game_file"]) == ("go to desk 1", ["go to desk 1"], "/games/t.tw-pddl")
