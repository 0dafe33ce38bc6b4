"""Worker-process env pool: each worker process holds a contiguous block of slots.

Workers run concurrently; the slots of one worker run one after another in it, in
request order. Every call has a deadline, so the pool never waits for a hung worker: a
worker that dies or overruns is killed and restarted with fresh envs (see
:mod:`hp_agent.envs.pool` for what callers see then).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import time
from multiprocessing.connection import wait

from hp_agent.envs.pool.base import EnvAttributes, EnvError, EnvPool, Request, Result, require_slots
from hp_agent.envs.pool.process import GRACE_S, Worker
from hp_agent.errors import UserValueError

log = logging.getLogger(__name__)


class WorkerPool(EnvPool):
    """``num_envs`` envs built from ``env`` (a registered name or ``"module:factory"``) in
    ``min(num_workers, num_envs)`` worker processes."""

    def __init__(
        self,
        env: str,
        num_envs: int | None,
        num_workers: int,
        env_kwargs: dict | None = None,
        *,
        step_timeout: float = 60.0,
        reset_timeout: float = 120.0,
        start_timeout: float = 300.0,
        start_method: str | None = None,
    ):
        if num_workers < 1:
            raise ValueError(f"a WorkerPool needs num_workers >= 1, got {num_workers}")
        self.env_spec, self.env_kwargs = env, dict(env_kwargs or {})
        self.num_envs = require_slots(num_envs)
        self.num_workers = min(num_workers, self.num_envs)
        self.step_timeout, self.reset_timeout, self.start_timeout = step_timeout, reset_timeout, start_timeout
        self.restarts, self.closed = 0, False
        self._workers: list[Worker] = []
        self._lost: set[int] = set()  # slots whose env was rebuilt: step is refused until reset
        self._next_id = 0
        self._slot_worker = [index for index in range(self.num_workers) for _ in self.worker_slots(index)]
        method = start_method or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        self._context = mp.get_context(method)
        if method == "forkserver":  # workers fork from a server with the worker's module loaded
            self._context.set_forkserver_preload([Worker.__module__])
        try:
            for index in range(self.num_workers):
                self._workers.append(self._start_worker(index))
            self._await_ready()
        except BaseException:
            self.close()
            raise
        # Every worker has built its envs by now, so each has attributes.
        self.attributes = EnvAttributes.combined([worker.attributes for worker in self._workers])  # type: ignore[arg-type]

    def worker_pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers]

    # --- calls -------------------------------------------------------------------------

    def _calls(self, kind: str, requests: list[Request]) -> list[Result]:
        timeout = self.reset_timeout if kind == "reset" else self.step_timeout
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

    def _receive(self, worker: Worker, results: list[Result | None], timeout: float) -> None:
        """Take every answer ``worker`` has sent; a worker found dead fails its requests."""
        dead = False
        try:
            while worker.pending and worker.conn.poll():
                message = worker.receive()
                if message is not None:
                    if message[1] != worker.pending[0][0]:  # answers come in request order:
                        continue  # this is a stale answer to a call that was interrupted
                    _, position, slot, kind = worker.pending.popleft()
                    results[position] = _unpickled(message[2])
                    if kind == "reset" and not isinstance(results[position], EnvError):
                        self._lost.discard(slot)
                worker.deadline = time.monotonic() + timeout
        except (EOFError, OSError):
            dead = True
        if worker.pending and (dead or not worker.process.is_alive()):
            self._fail(worker, results, "WorkerDied", None)

    def _fail(self, worker: Worker, results: list[Result | None], error_type: str, reason: str | None) -> None:
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

    def _replace(self, worker: Worker) -> None:
        if worker.process.is_alive() or not worker.conn.closed:
            worker.kill()
        self._lost.update(self.worker_slots(worker.index))
        self._workers[worker.index] = self._start_worker(worker.index)
        self.restarts += 1

    # --- start and stop ------------------------------------------------------------------

    def _start_worker(self, index: int) -> Worker:
        return Worker(self._context, index, self.env_spec, self.env_kwargs, len(self.worker_slots(index)))

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        for worker in self._workers:
            try:
                while not worker.ready:
                    if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                        raise TimeoutError(f"env worker {worker.index} did not build its envs within {self.start_timeout:g} s")
                    worker.receive()
            except (EOFError, OSError):
                worker.process.join(GRACE_S)
                raise RuntimeError(f"env worker {worker.index} {worker.exit_text()} while building {self.env_spec!r} envs") from None
            if worker.broken is not None and worker.broken.user_error:
                raise UserValueError(worker.broken.message)
            if worker.broken is not None:
                raise RuntimeError(
                    f"env worker {worker.index} could not build {self.env_spec!r} envs: {worker.broken}\n{worker.broken.traceback}")

    def close(self) -> None:
        """Stop the workers: each closes its envs; one that lingers is killed."""
        if self.closed:
            return
        self.closed = True
        for worker in self._workers:
            worker.hang_up()
        deadline = time.monotonic() + GRACE_S
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(GRACE_S)


def _unpickled(payload: bytes) -> Result:
    try:
        return pickle.loads(payload)
    except Exception as error:
        return EnvError.from_exception(error)
