"""The served app as an importable object, for OpenEnv's tooling (``openenv.yaml``'s ``app``)
and any ASGI server: ``HP_AGENT_SERVE_ENV=alfworld uvicorn hp_agent.envs.wire.app:app``.

``HP_AGENT_SERVE_ENV`` names the env (default ``keys``), ``HP_AGENT_SERVE_KWARGS`` its
arguments as a YAML mapping; ``hp-agent serve`` takes the same as flags, and more.
"""

from __future__ import annotations

import os

import yaml

from hp_agent.envs.wire.server import build_app
from hp_agent.errors import UserValueError

_kwargs = yaml.safe_load(os.environ.get("HP_AGENT_SERVE_KWARGS", "{}"))
if not isinstance(_kwargs, dict):
    raise UserValueError(f"HP_AGENT_SERVE_KWARGS must be a YAML mapping, got {os.environ['HP_AGENT_SERVE_KWARGS']!r}")
app = build_app(os.environ.get("HP_AGENT_SERVE_ENV", "keys"), _kwargs)
