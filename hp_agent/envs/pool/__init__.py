"""Env pool: many env slots, stepped in this process or in parallel in worker processes.

``make_env_pool(env, num_envs, num_workers)`` returns an :class:`EnvPool` of ``num_envs``
env slots: a :class:`LocalPool` with ``num_workers=0`` (the envs live in this process
and are called one after another), else a :class:`WorkerPool` (each worker holds a
contiguous block of slots, worker 0 the first ``num_envs / num_workers``, and so on;
workers run concurrently, and the slots of one worker run one after another in it, in
request order). :meth:`EnvPool.balanced_slots` picks slots for a batch of episodes: as
many on each worker, adjacent episodes on the same worker, so the copies of one prompt
share a worker's caches (an ALFWorld game is translated once).

* ``env`` is a registered env name (built with ``hp_agent.envs.make(env, **env_kwargs)``)
  or an importable ``"module:factory"``; an in-process pool also takes a list of env
  instances. Workers are fresh processes (``forkserver``, else ``spawn``; never
  ``fork``: the parent has torch and its threads loaded), so they see the built-in
  envs, entry-point plugins and ``module:factory`` specs, but not envs that were
  ``register()``-ed at run time in the parent only: put such an env in an importable
  module and pass ``"module:factory"``. Workers get the parent's ``sys.path``, working
  folder and environment variables as they are at start.
* ``reset_many([(slot, seed, options), ...])`` and ``step_many([(slot, action), ...])``
  return one result per request, in request order: Gymnasium's tuple, or an
  :class:`EnvError` (type, message, traceback text). They never raise for a failing env.
  Infos cross process boundaries in a worker pool, so they must be picklable (a result
  that is not becomes an ``EnvError``).
* Each env call has a time limit in a worker pool (``step_timeout``, ``reset_timeout``;
  counted from when the worker could start it; an in-process pool cannot enforce it). A
  worker that dies (exit, crash, signal) or overruns is killed and restarted with fresh
  envs: every request of the call it had not answered yet gets an ``EnvError``
  (``WorkerDied`` or ``EnvTimeout``), and a later ``step`` on any of its slots gets
  ``EnvStateLost`` until that slot is reset. The pool itself never waits without a deadline.
* ``system_prompt``, ``answer_format``, ``reward_bounds`` and ``task_ids()`` are read once,
  from the first env; ``max_turns`` is the most that any env of the pool allows
  (:class:`~hp_agent.envs.pool.base.EnvAttributes`).
* Workers are daemonic, ignore Ctrl-C (the parent handles it) and exit when their pipe
  to the parent closes: on ``close()``, or when the parent dies. Use ``with make_env_pool(...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hp_agent.envs.base import TextEnv
from hp_agent.envs.pool.base import EnvError, EnvPool
from hp_agent.envs.pool.local import LocalPool
from hp_agent.envs.pool.workers import WorkerPool

__all__ = ["EnvError", "EnvPool", "LocalPool", "WorkerPool", "make_env_pool"]


def make_env_pool(
    env: str | Sequence[TextEnv],
    num_envs: int | None = None,
    num_workers: int = 0,
    env_kwargs: dict | None = None,
    **worker_options: Any,
) -> EnvPool:
    """An in-process pool for ``num_workers=0``, else a worker pool.

    ``worker_options`` go to :class:`WorkerPool` (``step_timeout``, ``reset_timeout``,
    ``start_timeout``, ``start_method``); an in-process pool has no use for them.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if num_workers == 0:
        return LocalPool(env, num_envs, env_kwargs)
    if not isinstance(env, str):
        raise ValueError("a pool over existing env instances runs in-process with one slot per env")
    return WorkerPool(env, num_envs, num_workers, env_kwargs, **worker_options)
