"""hp_agent envs over OpenEnv's wire protocol, both ways.

* :mod:`~hp_agent.envs.wire.server` serves any registered env as an OpenEnv server
  (``hp-agent serve``): OpenEnv's own FastAPI app and types, one env worker process per
  WebSocket session (ALFWorld is not thread-safe), explicit observation fields.
* :mod:`~hp_agent.envs.wire.client` is the env ``openenv`` (``--env openenv:URL``): a
  :class:`~hp_agent.envs.base.TextEnv` that plays a remote OpenEnv server through
  OpenEnv's client, so train, eval and compare run on it unchanged.
* :mod:`~hp_agent.envs.wire.messages` holds what both sides agree on.
"""
