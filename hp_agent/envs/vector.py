"""Env pool: many env slots, stepped in parallel in worker processes.

``EnvPool(env, num_envs, num_workers)`` holds ``num_envs`` env slots. With
``num_workers=0`` the envs live in this process and are called one after another; else
each worker holds a contiguous block of slots (worker 0 the first ``num_envs /
num_workers``, and so on), workers run concurrently, and the slots of one worker run one
after another in it, in request order. :meth:`EnvPool.balanced_slots` picks slots for a
batch of episodes: as many on each worker, adjacent episodes on the same worker, so the
copies of one prompt share a worker's caches (an ALFWorld game is translated once).

* ``env`` is a registered env name (built with ``hp_agent.envs.make(env, **env_kwargs)``)
  or an importable ``"module:factory"``. Workers are fresh processes (``forkserver``,
  else ``spawn``; never ``fork``: the parent has torch and its threads loaded), so they
  see the built-in envs, entry-point plugins and ``module:factory`` specs, but not envs
  that were ``register()``-ed at run time in the parent only: put such an env in an
  importable module and pass ``"module:factory"``. Workers get the parent's
  ``sys.path``, working folder and environment variables as they are at start.
* ``reset_many([(slot, seed, options), ...])`` and ``step_many([(slot, action), ...])``
  return one result per request, in request order: Gymnasium's tuple, or an
  :class:`EnvError` (type, message, traceback text). They never raise for a failing env.
  Infos cross process boundaries, so they must be picklable (a result that is not
  becomes an ``EnvError``).
* Each env call has a time limit (``step_timeout``, ``reset_timeout``; counted from when
  the worker could start it; in-process pools cannot enforce it). A worker that dies
  (exit, crash, signal) or overruns is killed and restarted with fresh envs: every
  request of the call it had not answered yet gets an ``EnvError`` (``WorkerDied`` or
  ``EnvTimeout``), and a later ``step`` on any of its slots gets ``EnvStateLost`` until
  that slot is reset. The pool itself never waits without a deadline.
* ``system_prompt``, ``answer_format``, ``max_turns``, ``reward_bounds`` and ``task_ids()`` are read once,
  from the first env.
* Workers are daemonic, ignore Ctrl-C (the parent handles it) and exit when their pipe
  to the parent closes: on ``close()``, or when the parent dies. Use ``with EnvPool(...)``.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Union

from hp_agent.envs import make
from hp_agent.envs.base import TextEnv

log = logging.getLogger(__name__)

_GRACE_S = 5.0  # how long a closing worker may take to close its envs before it is killed


@dataclass(frozen=True)
class EnvError:
    """A failed env call: exception type name, message and traceback text.

    Besides the env's own exceptions the pool reports ``WorkerDied``, ``EnvTimeout`` and
    ``EnvStateLost`` (a step on a slot whose env was rebuilt, before its next reset).
    """

    type: str
    message: str
    traceback: str = ""

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"

    @classmethod
    def from_exception(cls, error: BaseException) -> EnvError:
        return cls(type(error).__name__, str(error), "".join(traceback.format_exception(error)))


Result = Union[tuple, EnvError]


def build_env(spec: str, **kwargs: Any) -> TextEnv:
    """Build a registered env by name, or call the factory of a ``"module:factory"`` spec."""
    if ":" not in spec:
        return make(spec, **kwargs)
    module_name, _, attr = spec.partition(":")
    env = getattr(import_module(module_name), attr)(**kwargs)
    if not isinstance(env, TextEnv):
        raise TypeError(f"env factory {spec!r} returned {type(env).__name__}, expected a TextEnv subclass")
    return env


def _attributes(env: TextEnv) -> dict[str, Any]:
    try:
        task_ids = list(env.task_ids())
    except NotImplementedError:
        task_ids = None
    return {"system_prompt": env.system_prompt, "answer_format": env.answer_format, "max_turns": int(env.max_turns),
            "reward_bounds": tuple(env.reward_bounds), "task_ids": task_ids}


def _call(env: TextEnv, kind: str, args: Any) -> Result:
    try:
        if kind == "reset":
            seed, options = args
            return env.reset(seed=seed, options=options)
        return env.step(args)
    except Exception as error:  # one broken env must not stop the others
        return EnvError.from_exception(error)


# --- worker process ------------------------------------------------------------------


def _worker_main(conn, spec: str, kwargs: dict, num_envs: int, environ: dict, with_attributes: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.environ.clear()
    os.environ.update(environ)  # a forkserver child would otherwise see the server's
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_until_eof, args=(conn, inbox), daemon=True).start()
    envs: list[TextEnv] = []
    broken = attributes = None
    try:
        envs = [build_env(spec, **kwargs) for _ in range(num_envs)]
        attributes = _attributes(envs[0]) if with_attributes else None
    except Exception as error:  # answered to every request, and to the pool's start-up
        broken = EnvError.from_exception(error)
    try:
        conn.send(("ready", attributes, broken))
        while (batch := inbox.get()) is not None:
            for request_id, local_slot, kind, args in batch:  # one answer each, as soon as it is ready
                result = broken or _call(envs[local_slot], kind, args)
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


def _read_until_eof(conn, inbox: queue.SimpleQueue) -> None:
    """Queue the parent's requests; when the pipe closes (pool closed, parent dead), stop."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):
        pass
    except Exception:
        traceback.print_exc()
    inbox.put(None)
    time.sleep(_GRACE_S)  # the main thread closes its envs and returns meanwhile,
    os._exit(0)  # unless an env call hangs: it must not outlive the parent


# --- parent side ---------------------------------------------------------------------


def _send_all(conn, outbox: queue.SimpleQueue) -> None:
    """Send queued requests: a stuck worker then blocks this thread, never the pool."""
    while (message := outbox.get()) is not None:
        try:
            conn.send(message)
        except Exception:
            return  # the worker is gone; its sentinel tells the pool


class _Worker:
    """The parent's handle of one worker process: pipe, sender thread, requests in flight."""

    def __init__(self, context, index: int, spec: str, kwargs: dict, num_envs: int, with_attributes: bool):
        self.index = index
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=_worker_main, args=(child_conn, spec, kwargs, num_envs, dict(os.environ), with_attributes),
            name=f"hp-agent-env-worker-{index}", daemon=True,
        )
        self.process.start()
        child_conn.close()
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sender = threading.Thread(target=_send_all, args=(self.conn, self.outbox), daemon=True)
        self.sender.start()
        self.ready = False
        self.attributes: dict[str, Any] | None = None
        self.broken: EnvError | None = None
        self.pending: deque[tuple[int, int, int, str]] = deque()  # (request id, position, slot, kind)
        self.deadline = math.inf

    def hang_up(self) -> None:
        """Close the pipe: a live worker then closes its envs and exits."""
        self.outbox.put(None)
        self.sender.join(_GRACE_S)
        if self.sender.is_alive():  # blocked sending to a hung worker
            self.process.kill()
            self.sender.join(_GRACE_S)
        self.conn.close()

    def kill(self) -> None:
        if self.process.is_alive():  # never signal a pid that may have been reused
            self.process.kill()
        self.process.join(_GRACE_S)
        self.hang_up()

    def exit_text(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"


class EnvPool:
    """``num_envs`` env slots, in this process (``num_workers=0``) or in worker processes.

    ``env`` may also be a list of existing env instances: an in-process pool over them
    (the caller keeps owning them; ``close()`` leaves them open).
    """

    def __init__(
        self,
        env: str | Sequence[TextEnv],
        num_envs: int | None = None,
        num_workers: int = 0,
        env_kwargs: dict | None = None,
        *,
        step_timeout: float = 60.0,
        reset_timeout: float = 120.0,
        start_timeout: float = 300.0,
        start_method: str | None = None,
    ):
        self._envs: list[TextEnv] = []
        self._workers: list[_Worker] = []
        self._closed, self._owns_envs = False, True
        if not isinstance(env, str):
            self._envs, self._owns_envs = list(env), False
            if num_workers or (num_envs is not None and num_envs != len(self._envs)):
                raise ValueError("a pool over existing env instances runs in-process with one slot per env")
            num_envs = len(self._envs)
        if not num_envs or num_envs < 1:
            raise ValueError(f"an EnvPool needs at least one env slot, got num_envs={num_envs}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.env_spec = env if isinstance(env, str) else type(self._envs[0]).__name__
        self.env_kwargs = dict(env_kwargs or {})
        self.num_envs, self.num_workers = num_envs, min(num_workers, num_envs)
        self.step_timeout, self.reset_timeout, self.start_timeout = step_timeout, reset_timeout, start_timeout
        self.restarts = 0
        self._lost: set[int] = set()  # slots whose env was rebuilt: step is refused until reset
        self._next_id = 0
        if self.num_workers == 0:
            if self._owns_envs:
                self._envs = [build_env(env, **self.env_kwargs) for _ in range(num_envs)]
            self._attributes = {"system_prompt": self._envs[0].system_prompt, "answer_format": self._envs[0].answer_format,
                                "reward_bounds": tuple(self._envs[0].reward_bounds),
                                "max_turns": max(int(e.max_turns) for e in self._envs)}
            return
        self._slot_worker = [index for index in range(self.num_workers) for _ in self.worker_slots(index)]
        method = start_method or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        self._context = mp.get_context(method)
        if method == "forkserver":
            self._context.set_forkserver_preload([__name__])  # workers fork from a server with this loaded
        try:
            for index in range(self.num_workers):
                self._workers.append(self._start_worker(index, with_attributes=index == 0))
            self._await_ready()
        except BaseException:
            self.close()
            raise
        self._attributes = self._workers[0].attributes

    # --- what rollout reads ------------------------------------------------------------

    @property
    def system_prompt(self) -> str | None:
        return self._attributes["system_prompt"]

    @property
    def answer_format(self) -> str | None:
        return self._attributes["answer_format"]

    @property
    def max_turns(self) -> int:
        return self._attributes["max_turns"]

    @property
    def reward_bounds(self) -> tuple[float, float]:
        return self._attributes["reward_bounds"]

    def task_ids(self) -> list[str]:
        if self._envs:
            return self._envs[0].task_ids()
        if self._attributes["task_ids"] is None:
            raise NotImplementedError(f"env {self.env_spec!r} does not list its task ids")
        return list(self._attributes["task_ids"])

    def worker_pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers]

    def worker_cpu_seconds(self) -> float:
        """CPU seconds the live worker processes have used so far (from ``/proc``; 0 where
        it cannot be read, and for an in-process pool, whose envs use the caller's CPU)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self.worker_pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        return total

    def worker_slots(self, index: int) -> range:
        """The slots worker ``index`` holds: a contiguous block, sizes differing by at most one."""
        if not self.num_workers:  # in-process: one "worker", this process
            return range(self.num_envs)
        size, extra = divmod(self.num_envs, self.num_workers)
        start = index * size + min(index, extra)
        return range(start, start + size + (index < extra))

    def balanced_slots(self, count: int) -> list[int]:
        """Slots for ``count`` adjacent episodes: the same number (within one) on each worker,
        in order, so neighbours (a prompt's copies) play on one worker."""
        if not 1 <= count <= self.num_envs:
            raise ValueError(f"count must be between 1 and num_envs={self.num_envs}, got {count}")
        if not self._workers:
            return list(range(count))
        size, extra = divmod(count, self.num_workers)
        return [slot for index in range(self.num_workers)
                for slot in self.worker_slots(index)[: size + (index < extra)]]

    # --- calls -------------------------------------------------------------------------

    def reset_many(self, requests: Sequence[tuple[int, int | None, dict | None]]) -> list[Result]:
        """Reset each ``(slot, seed, options)``; one ``(observation, info)`` or EnvError each."""
        return self._run("reset", [(slot, (seed, options)) for slot, seed, options in requests], self.reset_timeout)

    def step_many(self, requests: Sequence[tuple[int, str]]) -> list[Result]:
        """Step each ``(slot, action)``; one ``(obs, reward, terminated, truncated, info)`` or EnvError each."""
        return self._run("step", list(requests), self.step_timeout)

    def _run(self, kind: str, requests: list[tuple[int, Any]], timeout: float) -> list[Result]:
        if self._closed:
            raise RuntimeError("this EnvPool is closed")
        for slot, _ in requests:
            if not 0 <= slot < self.num_envs:
                raise IndexError(f"slot {slot} is out of range for a pool of {self.num_envs} envs")
        if not self._workers:
            return [_call(self._envs[slot], kind, args) for slot, args in requests]
        for worker in list(self._workers):
            if worker.pending:  # an earlier call was interrupted (e.g. Ctrl-C): its envs' state is unknown
                log.warning("env worker %d still held requests of an interrupted call; restarting it", worker.index)
                worker.pending.clear()
                self._replace(worker)
            elif not worker.process.is_alive():
                log.warning("env worker %d %s while idle; restarting it", worker.index, worker.exit_text())
                self._replace(worker)
        results: list[Result | None] = [None] * len(requests)
        batches: dict[int, list] = {}
        now = time.monotonic()
        for position, (slot, args) in enumerate(requests):
            if kind == "step" and slot in self._lost:
                results[position] = EnvError(
                    "EnvStateLost", f"slot {slot}'s env was rebuilt when its worker restarted; reset the slot first")
                continue
            worker = self._workers[self._slot_worker[slot]]
            if not worker.pending:
                worker.deadline = now + timeout + (0.0 if worker.ready else self.start_timeout)
            self._next_id += 1
            worker.pending.append((self._next_id, position, slot, kind))
            local_slot = slot - self.worker_slots(worker.index).start
            batches.setdefault(worker.index, []).append((self._next_id, local_slot, kind, args))
        for index, batch in batches.items():  # one message per worker and call
            self._workers[index].outbox.put(batch)
        while busy := [worker for worker in self._workers if worker.pending]:
            handles = {h: w for w in busy for h in (w.conn, w.process.sentinel)}
            for handle in wait(list(handles), max(0.0, min(w.deadline for w in busy) - time.monotonic())):
                if handles[handle].pending:
                    self._receive(handles[handle], results, timeout)
            for worker in busy:
                if worker.pending and time.monotonic() >= worker.deadline:
                    _, _, slot, what = worker.pending[0]
                    limit = timeout + (0.0 if worker.ready else self.start_timeout)
                    self._fail(worker, results, "EnvTimeout", f"{what} on slot {slot} took longer than {limit:g} s")
        return results  # type: ignore[return-value]

    def _receive(self, worker: _Worker, results: list, timeout: float) -> None:
        """Take every answer ``worker`` has sent; a worker found dead fails its requests."""
        dead = False
        try:
            while worker.pending and worker.conn.poll():
                message = worker.conn.recv()
                if message[0] == "ready":
                    _, worker.attributes, worker.broken = message
                    worker.ready = True
                elif message[1] == worker.pending[0][0]:  # answers come in request order
                    _, position, slot, kind = worker.pending.popleft()
                    try:
                        results[position] = pickle.loads(message[2])
                    except Exception as error:
                        results[position] = EnvError.from_exception(error)
                    if kind == "reset" and not isinstance(results[position], EnvError):
                        self._lost.discard(slot)
                else:
                    continue  # a stale answer to a call that was interrupted
                worker.deadline = time.monotonic() + timeout
        except (EOFError, OSError):
            dead = True
        if worker.pending and (dead or not worker.process.is_alive()):
            self._fail(worker, results, "WorkerDied", None)

    def _fail(self, worker: _Worker, results: list, error_type: str, reason: str | None) -> None:
        _, _, slot, kind = worker.pending[0]
        worker.kill()
        if reason is None:
            reason = f"env worker {worker.index} (pid {worker.process.pid}) {worker.exit_text()} during {kind} on slot {slot}"
        else:
            reason = f"{reason}; env worker {worker.index} (pid {worker.process.pid}) was killed"
        message = f"{reason}; it was restarted with fresh envs"
        for k, (_, position, _, _) in enumerate(worker.pending):
            results[position] = EnvError(error_type, message if k == 0 else f"not run: {message}")
        worker.pending.clear()
        log.warning("%s", message)
        self._replace(worker)

    def _replace(self, worker: _Worker) -> None:
        if worker.process.is_alive() or not worker.conn.closed:
            worker.kill()
        self._lost.update(self.worker_slots(worker.index))
        self._workers[worker.index] = self._start_worker(worker.index)
        self.restarts += 1

    # --- start and stop ------------------------------------------------------------------

    def _start_worker(self, index: int, with_attributes: bool = False) -> _Worker:
        slots = len(self.worker_slots(index))
        return _Worker(self._context, index, self.env_spec, self.env_kwargs, slots, with_attributes)

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        for worker in self._workers:
            try:
                while not worker.ready:
                    if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                        raise TimeoutError(f"env worker {worker.index} did not build its envs within {self.start_timeout:g} s")
                    message = worker.conn.recv()
                    if message[0] == "ready":
                        _, worker.attributes, worker.broken = message
                        worker.ready = True
            except (EOFError, OSError):
                worker.process.join(_GRACE_S)
                raise RuntimeError(f"env worker {worker.index} {worker.exit_text()} while building {self.env_spec!r} envs") from None
            if worker.broken is not None:
                raise RuntimeError(
                    f"env worker {worker.index} could not build {self.env_spec!r} envs: {worker.broken}\n{worker.broken.traceback}")

    def close(self) -> None:
        """Stop the workers (each closes its envs; one that lingers is killed) or close owned envs."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.hang_up()
        deadline = time.monotonic() + _GRACE_S
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(_GRACE_S)
        if self._owns_envs:
            for env in self._envs:
                env.close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EnvPool({self.env_spec!r}, num_envs={self.num_envs}, num_workers={self.num_workers})"
