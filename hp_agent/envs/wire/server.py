"""``hp-agent serve``: any registered env as an OpenEnv server.

Built on OpenEnv's own FastAPI app (``/ws`` sessions, ``/health``, ``/schema``,
``/metadata``, ``CAPACITY_REACHED`` past ``max_sessions``, an idle-session reaper). Each
WebSocket session gets its own env in its own worker process
(:class:`~hp_agent.envs.pool.workers.WorkerPool` with one slot): ALFWorld's engine is not
thread-safe, and a crashing or hanging env then costs one session, not the server.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata, State

from hp_agent.envs import check_kwargs, env_factory
from hp_agent.envs.pool import EnvError, WorkerPool
from hp_agent.envs.wire.messages import ATTRIBUTES_ROUTE, EnvAttributesMessage, TextAction, TextObservation, observation_of
from hp_agent.errors import UserValueError

MAX_MESSAGE_BYTES = 1 << 20  # a WebSocket message over this closes its connection (actions are <= 32 KiB)


class ServedEnv(Environment):
    """One session's env: a worker process holding one env built from ``spec``."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own process

    def __init__(self, spec: str, env_kwargs: dict[str, Any], privileged: bool, step_timeout: float, reset_timeout: float):
        super().__init__()
        self._spec, self._privileged = spec, privileged
        self._pool = WorkerPool(spec, 1, 1, env_kwargs, step_timeout=step_timeout, reset_timeout=reset_timeout)
        self._state = State()
        self._playing = False

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **_: Any) -> TextObservation:
        options = {"task_id": task_id} if task_id is not None else None
        text, info = _checked(self._pool.reset_many([(0, seed, options)])[0])
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0, task_id=info.get("task_id"))
        self._playing = True
        return observation_of(text, info, None, False, False, self._privileged)

    def step(self, action: TextAction, timeout_s: float | None = None, **_: Any) -> TextObservation:
        if not self._playing:
            raise RuntimeError("no episode is running: send a reset first (after a reset, until the episode is done)")
        text, reward, terminated, truncated, info = _checked(self._pool.step_many([(0, action.text)])[0])
        self._state.step_count += 1
        self._playing = not (terminated or truncated)
        return observation_of(text, info, float(reward), bool(terminated), bool(truncated), self._privileged)

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self._spec, description=f"hp_agent env {self._spec!r}, one process per session")

    def close(self) -> None:
        self._pool.close()


def _checked(result: tuple | EnvError) -> tuple:
    if isinstance(result, EnvError):
        raise RuntimeError(str(result))
    return result


def env_attributes(spec: str, env_kwargs: dict[str, Any]) -> EnvAttributesMessage:
    """Build the env once in a worker (a bad kwarg fails here, before any client connects)
    and read what a client needs to know of it."""
    if ":" not in spec:  # a registered env: a wrong name or argument is one line, before a process starts
        check_kwargs(spec, env_factory(spec), env_kwargs)
    with WorkerPool(spec, 1, 1, env_kwargs) as pool:
        attributes = pool.attributes
    return EnvAttributesMessage(env=spec, system_prompt=attributes.system_prompt, answer_format=attributes.answer_format,
                                action_template=attributes.action_template, max_turns=attributes.max_turns,
                                reward_bounds=attributes.reward_bounds, task_ids=attributes.task_ids)


def build_app(spec: str, env_kwargs: dict[str, Any] | None = None, *, max_sessions: int = 8, idle_timeout: float = 600.0,
              privileged: bool = False, step_timeout: float = 60.0, reset_timeout: float = 120.0) -> Any:
    """The FastAPI app serving ``spec``: OpenEnv's routes plus ``ATTRIBUTES_ROUTE``."""
    if max_sessions < 1:
        raise UserValueError(f"max_sessions must be >= 1, got {max_sessions}")
    if idle_timeout <= 0:
        raise UserValueError(f"idle_timeout must be > 0 seconds, got {idle_timeout}")
    env_kwargs = dict(env_kwargs or {})
    attributes = env_attributes(spec, env_kwargs)
    factory = partial(ServedEnv, spec, env_kwargs, privileged, step_timeout, reset_timeout)
    app = create_app(factory, TextAction, TextObservation, env_name=spec,
                     concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_timeout))
    app.get(ATTRIBUTES_ROUTE)(lambda: attributes)
    return app


class _QuietDisconnects:
    """ASGI wrapper: OpenEnv 0.3.0's ``/ws`` handler closes a socket the client already
    closed and raises ``WebSocketDisconnect``, which uvicorn would log as a crash with a
    traceback each time a client leaves without a ``close`` message."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope["type"] != "websocket":
                raise


def serve(spec: str, env_kwargs: dict[str, Any] | None = None, *, host: str = "127.0.0.1", port: int = 8000,
          announce: Callable[[], None] = lambda: None, **options: Any) -> None:
    """Serve ``spec`` until interrupted; ``announce`` runs once the env has been built."""
    import uvicorn

    app = build_app(spec, env_kwargs, **options)
    announce()
    uvicorn.run(_QuietDisconnects(app), host=host, port=port, ws_max_size=MAX_MESSAGE_BYTES, log_level="warning")
