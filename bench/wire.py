"""Env steps per second over OpenEnv's wire protocol against the same env in this process.

    OMP_NUM_THREADS=1 .venv/bin/python bench/wire.py --env keys --sessions 8 --steps 200
    OMP_NUM_THREADS=1 .venv/bin/python bench/wire.py --env alfworld --env-kwargs '{split: id, num_games: 6}' --sessions 4 --steps 100

Starts `hp-agent serve` on a free 127.0.0.1 port, then plays ``--sessions`` sessions at
once (a thread each, each its own WebSocket and server-side env process) for ``--steps``
steps each, taking the first admissible action (a new episode when one ends). The local
figure plays the same number of steps, one env after another, in this process. Both
exclude start-up (the server's, and each session's first reset: building its env process).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import yaml

from hp_agent.envs import make


def play(env, steps: int, seed: int) -> int:
    """``steps`` steps of first-admissible-action play, resetting as episodes end; the steps taken."""
    _, info = env.reset(seed=seed)
    for step in range(steps):
        _, _, terminated, truncated, info = env.step((info.get("admissible_actions") or ["look"])[0])
        if terminated or truncated:
            _, info = env.reset(seed=seed + step + 1)
    return steps


def start_server(env: str, kwargs: dict, sessions: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "hp_agent", "serve", "--env", env, "--env-kwargs", json.dumps(kwargs),
                               "--port", str(port), "--max-sessions", str(sessions)], start_new_session=True)
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return server, f"ws://127.0.0.1:{port}"
        except OSError:
            if server.poll() is not None:
                raise SystemExit(f"the server exited with {server.returncode}")
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="keys")
    parser.add_argument("--env-kwargs", default="{}")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200, help="steps per session")
    args = parser.parse_args()
    kwargs = yaml.safe_load(args.env_kwargs)

    local = [make(args.env, **kwargs) for _ in range(args.sessions)]
    for index, env in enumerate(local):
        env.reset(seed=index)
    start = time.perf_counter()
    local_steps = sum(play(env, args.steps, index) for index, env in enumerate(local))
    local_rate = local_steps / (time.perf_counter() - start)

    server, url = start_server(args.env, kwargs, args.sessions)
    try:
        remotes = [make("openenv", url=url) for _ in range(args.sessions)]
        for index, env in enumerate(remotes):
            env.reset(seed=index)  # each session's env process is built here, outside the timing
        counts = [0] * args.sessions
        threads = [threading.Thread(target=lambda k=k: counts.__setitem__(k, play(remotes[k], args.steps, k)))
                   for k in range(args.sessions)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wire_rate = sum(counts) / (time.perf_counter() - start)
        for env in remotes:
            env.close()
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    print(f"{args.env}: {args.sessions} sessions x {args.steps} steps")
    print(f"  local, one process:        {local_rate:8.1f} steps/s")
    print(f"  over the wire (127.0.0.1): {wire_rate:8.1f} steps/s = {wire_rate / local_rate:.2f}x local")


if __name__ == "__main__":
    main()
