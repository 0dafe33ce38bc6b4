"""hp_agent: RL post-training of language-model agents with HP-RLVR and GRPO.

Python API::

    import hp_agent
    summary = hp_agent.train({"algo": {"name": "hp-rlvr"}, "trainer": {"steps": 2}})
    result = hp_agent.evaluate(env="math", model=str(summary.run_dir), split="test")
    hp_agent.register("my-env", MyEnv)   # then env.name=my-env

The names below are imported on first use (PEP 562), so that importing a light part of
the package (``hp_agent.envs`` in an env worker, say) does not load torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# name -> the module that defines it
_EXPORTS = {
    "EvalResult": "hp_agent.evaluation",
    "RunSummary": "hp_agent.trainer",
    "TextEnv": "hp_agent.envs.base",
    "TrainConfig": "hp_agent.config",
    "Verdict": "hp_agent.verifiers",
    "evaluate": "hp_agent.evaluation",
    "list_envs": "hp_agent.envs",
    "load_config": "hp_agent.config",
    "make": "hp_agent.envs",
    "register": "hp_agent.envs",
    "train": "hp_agent.trainer",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from hp_agent.config import TrainConfig, load_config
    from hp_agent.envs import list_envs, make, register
    from hp_agent.envs.base import TextEnv
    from hp_agent.evaluation import EvalResult, evaluate
    from hp_agent.trainer import RunSummary, train
    from hp_agent.verifiers import Verdict


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hp_agent' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # found directly next time
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
