"""Environment registry: ``make(name, **kwargs)``, ``register(name, factory)``.

Built-in envs register themselves below. Third-party packages add envs through the
entry-point group ``hp_agent.envs`` (name = env name, value = ``module:factory``); they
are discovered the first time a name is looked up.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib import import_module
from importlib.metadata import entry_points

from hp_agent.envs.base import TextEnv, text_space
from hp_agent.errors import UserLookupError, UserValueError

EnvFactory = Callable[..., TextEnv]

_REGISTRY: dict[str, EnvFactory | str] = {}
_ENTRY_POINT_GROUP = "hp_agent.envs"
_entry_points_loaded = False


def register(name: str, factory: EnvFactory | str, *, overwrite: bool = False) -> None:
    """Register ``factory`` (a callable returning a TextEnv, or ``"module:attr"``)."""
    if not name or not name.replace("-", "_").replace(".", "_").isidentifier():
        raise ValueError(f"env name {name!r} is not valid: use letters, digits, '-', '_' or '.'")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"env {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = factory


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=_ENTRY_POINT_GROUP):
        _REGISTRY.setdefault(ep.name, ep.value)


def list_envs() -> list[str]:
    """Names of all registered envs, built-in and plugins."""
    _load_entry_points()
    return sorted(_REGISTRY)


def _resolve(factory: EnvFactory | str) -> EnvFactory:
    if callable(factory):
        return factory
    module_name, _, attr = factory.partition(":")
    return getattr(import_module(module_name), attr)


def env_factory(name: str) -> EnvFactory:
    """The registered factory of env ``name`` (usually its class), without building it."""
    _load_entry_points()
    if name not in _REGISTRY:
        raise UserLookupError(f"unknown env {name!r}; registered envs: {', '.join(list_envs())}")
    return _resolve(_REGISTRY[name])


def check_kwargs(name: str, factory: EnvFactory, kwargs: dict) -> None:
    """Refuse an argument ``factory`` does not take, naming it and the valid ones, before
    anything is built (a TypeError from deep inside a constructor names neither)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    valid = [key for key, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise UserValueError(f"env {name!r} has no argument {unknown[0]!r}; valid: {', '.join(valid)}")


OPENENV_PREFIX = "openenv:"


def split_env_spec(name: str, kwargs: dict) -> tuple[str, dict]:
    """``openenv:URL`` as the env ``openenv`` with ``url=URL``; any other name as it is."""
    if name.startswith(OPENENV_PREFIX):
        return "openenv", {**kwargs, "url": name[len(OPENENV_PREFIX):]}
    return name, kwargs


def make(name: str, **kwargs) -> TextEnv:
    """Build env ``name`` with ``kwargs`` passed to its factory."""
    factory = env_factory(name)
    check_kwargs(name, factory, kwargs)
    env = factory(**kwargs)
    if not isinstance(env, TextEnv):
        raise TypeError(f"env factory for {name!r} returned {type(env).__name__}, expected a TextEnv subclass")
    return env


register("math", "hp_agent.envs.math:MathEnv")
register("alfworld", "hp_agent.envs.alfworld.env:AlfworldEnv")
register("code", "hp_agent.envs.code:CodeEnv")
register("keys", "hp_agent.envs.toy:KeysEnv")
register("keystep", "hp_agent.envs.toy:KeyStepEnv")
register("fetch", "hp_agent.envs.fetch:FetchEnv")
register("openenv", "hp_agent.envs.wire.client:OpenEnvTextEnv")

__all__ = ["TextEnv", "env_factory", "list_envs", "make", "register", "split_env_spec", "text_space"]
