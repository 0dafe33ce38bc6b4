"""One env worker process: its main loop, and the parent's handle of it.

The worker builds its envs and sends ``("ready", attributes, broken)``; then it answers
each request of each batch the parent sends, in order and as soon as it is ready, with
``("result", request id, pickled result)``. It exits when its pipe to the parent closes.
"""

from __future__ import annotations

import math
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from hp_agent.envs.base import TextEnv
from hp_agent.envs.pool.base import EnvAttributes, EnvError, build_env, call_env

GRACE_S = 5.0  # how long a closing worker may take to close its envs before it is killed


# --- in the worker process -----------------------------------------------------------


def _worker_main(conn: Connection, spec: str, kwargs: dict, num_envs: int, environ: dict) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.environ.clear()
    os.environ.update(environ)  # a forkserver child would otherwise see the server's
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_until_eof, args=(conn, inbox), daemon=True).start()
    envs: list[TextEnv] = []
    broken = attributes = None
    try:
        envs = [build_env(spec, **kwargs) for _ in range(num_envs)]
        attributes = EnvAttributes.of(envs)
    except Exception as error:  # answered to every request, and to the pool's start-up
        broken = EnvError.from_exception(error)
    try:
        conn.send(("ready", attributes, broken))
        while (batch := inbox.get()) is not None:
            for request_id, local_slot, kind, args in batch:  # one answer each, as soon as it is ready
                result = broken or call_env(envs[local_slot], kind, args)
                try:
                    payload = pickle.dumps(result)
                except Exception as error:
                    payload = pickle.dumps(EnvError(type(error).__name__, f"the env's {kind} result is not picklable: {error}"))
                conn.send(("result", request_id, payload))
    except OSError:  # the parent is gone
        pass
    for env in envs:
        try:
            env.close()
        except Exception:
            pass


def _read_until_eof(conn: Connection, inbox: queue.SimpleQueue) -> None:
    """Queue the parent's requests; when the pipe closes (pool closed, parent dead), stop."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):
        pass
    except Exception:
        traceback.print_exc()
    inbox.put(None)
    time.sleep(GRACE_S)  # the main thread closes its envs and returns meanwhile,
    os._exit(0)  # unless an env call hangs: it must not outlive the parent


# --- in the parent -------------------------------------------------------------------


def _send_all(conn: Connection, outbox: queue.SimpleQueue) -> None:
    """Send queued requests: a stuck worker then blocks this thread, never the pool."""
    while (message := outbox.get()) is not None:
        try:
            conn.send(message)
        except Exception:
            return  # the worker is gone; its sentinel tells the pool


class Worker:
    """The parent's handle of one worker process: pipe, sender thread, requests in flight."""

    def __init__(self, context: Any, index: int, spec: str, kwargs: dict, num_envs: int):
        self.index = index
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=_worker_main, args=(child_conn, spec, kwargs, num_envs, dict(os.environ)),
            name=f"hp-agent-env-worker-{index}", daemon=True,
        )
        self.process.start()
        child_conn.close()
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sender = threading.Thread(target=_send_all, args=(self.conn, self.outbox), daemon=True)
        self.sender.start()
        self.ready = False
        self.attributes: EnvAttributes | None = None
        self.broken: EnvError | None = None
        self.pending: deque[tuple[int, int, int, str]] = deque()  # (request id, position, slot, kind)
        self.deadline = math.inf

    def receive(self) -> tuple | None:
        """The next message: a result, or None for the ready message (recorded here)."""
        message = self.conn.recv()
        if message[0] != "ready":
            return message
        _, self.attributes, self.broken = message
        self.ready = True
        return None

    def hang_up(self) -> None:
        """Close the pipe: a live worker then closes its envs and exits."""
        self.outbox.put(None)
        self.sender.join(GRACE_S)
        if self.sender.is_alive():  # blocked sending to a hung worker
            self.process.kill()
            self.sender.join(GRACE_S)
        self.conn.close()

    def kill(self) -> None:
        if self.process.is_alive():  # never signal a pid that may have been reused
            self.process.kill()
        self.process.join(GRACE_S)
        self.hang_up()

    def exit_text(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"
