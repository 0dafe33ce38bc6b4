"""Environment registry: ``make(name, **kwargs)``, ``register(name, factory)``.

Built-in envs register themselves below. Third-party packages add envs through the
entry-point group ``hp_agent.envs`` (name = env name, value = ``module:factory``); they
are discovered the first time a name is looked up.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from importlib.metadata import entry_points

from hp_agent.envs.base import TextEnv, text_space

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


def make(name: str, **kwargs) -> TextEnv:
    """Build env ``name`` with ``kwargs`` passed to its factory."""
    _load_entry_points()
    if name not in _REGISTRY:
        raise LookupError(f"unknown env {name!r}; registered envs: {', '.join(list_envs())}")
    env = _resolve(_REGISTRY[name])(**kwargs)
    if not isinstance(env, TextEnv):
        raise TypeError(f"env factory for {name!r} returned {type(env).__name__}, expected a TextEnv subclass")
    return env


register("math", "hp_agent.envs.math:MathEnv")
register("alfworld", "hp_agent.envs.alfworld.env:AlfworldEnv")
register("code", "hp_agent.envs.code:CodeEnv")
register("keys", "hp_agent.envs.toy:KeysEnv")
register("keystep", "hp_agent.envs.toy:KeyStepEnv")

__all__ = ["TextEnv", "list_envs", "make", "register", "text_space"]
