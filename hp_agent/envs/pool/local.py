"""In-process env pool: the envs live in this process and are called one after another.

An env that raises gives an :class:`EnvError` for its request, as in the worker pool.
Nothing else is guarded: time limits cannot be enforced here (an env that hangs holds
the call) and nothing is ever restarted.
"""

from __future__ import annotations

from collections.abc import Sequence

from hp_agent.envs.base import TextEnv
from hp_agent.envs.pool.base import EnvAttributes, EnvPool, Request, Result, build_env, call_env, require_slots


class LocalPool(EnvPool):
    """``num_envs`` envs built from ``env`` (a registered name or ``"module:factory"``).

    ``env`` may also be a list of existing env instances, one slot each; the caller keeps
    owning them (``close()`` leaves them open).
    """

    def __init__(self, env: str | Sequence[TextEnv], num_envs: int | None = None, env_kwargs: dict | None = None):
        self.env_kwargs = dict(env_kwargs or {})
        self._owns_envs = isinstance(env, str)
        if isinstance(env, str):
            self._envs = [build_env(env, **self.env_kwargs) for _ in range(require_slots(num_envs))]
        else:
            if num_envs is not None and num_envs != len(env):
                raise ValueError("a pool over existing env instances has one slot per env")
            self._envs = list(env)
        self.num_envs = require_slots(len(self._envs))
        self.env_spec = env if isinstance(env, str) else type(self._envs[0]).__name__
        self.num_workers, self.restarts, self.closed = 0, 0, False
        self.attributes = EnvAttributes.of(self._envs)

    def _calls(self, kind: str, requests: list[Request]) -> list[Result]:
        return [call_env(self._envs[slot], kind, args) for slot, args in requests]

    def worker_pids(self) -> list[int]:
        return []

    def close(self) -> None:
        """Close the envs this pool built."""
        if self.closed:
            return
        self.closed = True
        if self._owns_envs:
            for env in self._envs:
                env.close()
