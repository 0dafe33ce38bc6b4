"""The env ``openenv``: a :class:`~hp_agent.envs.base.TextEnv` over a remote OpenEnv server.

``--env openenv:URL`` (or ``env.name=openenv env.kwargs.url=URL``) plays the server at
``URL`` through OpenEnv's own client, one WebSocket session per env instance, so that
train, eval and compare run on it unchanged. The env's attributes (system prompt, answer
format, action template, turn limit, reward bounds, task ids) come from an hp_agent
server's ``ATTRIBUTES_ROUTE``; another OpenEnv server's observations are read from their
``text`` field (else the whole observation as JSON).

One session serves all of an env's episodes (the server keeps its env process across
resets). Faults: a connection that drops, errors or times out raises
:class:`RemoteEnvError`, which the env pool turns into an errored episode (counted, left
out of credit; the run goes on); the next reset opens a fresh session, with ``retries``
tries ``backoff`` seconds apart (doubling).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from openenv.core.generic_client import GenericEnvClient
from pydantic import ValidationError

from hp_agent.envs.base import TextEnv
from hp_agent.envs.wire.messages import ATTRIBUTES_ROUTE, EnvAttributesMessage, info_of
from hp_agent.errors import UserValueError


class RemoteEnvError(RuntimeError):
    """The server could not be reached, dropped the episode, or answered what is not an observation."""


def http_url(url: str) -> str:
    """``url``'s HTTP form (OpenEnv's client takes either and speaks WebSocket)."""
    for scheme, plain in (("wss://", "https://"), ("ws://", "http://")):
        if url.startswith(scheme):
            url = plain + url[len(scheme):]
    if not url.startswith(("http://", "https://")):
        raise UserValueError(f"openenv url {url!r} must start with ws://, wss://, http:// or https://")
    return url.rstrip("/").removesuffix("/ws")


def fetch_attributes(url: str, timeout: float) -> EnvAttributesMessage | None:
    """The served env's attributes; ``None`` where the server is not an hp_agent one."""
    try:
        with urllib.request.urlopen(http_url(url) + ATTRIBUTES_ROUTE, timeout=timeout) as reply:
            return EnvAttributesMessage.model_validate_json(reply.read())
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise RemoteEnvError(f"openenv server at {url}: {ATTRIBUTES_ROUTE} answered HTTP {error.code}") from error
    except (urllib.error.URLError, OSError) as error:
        raise RemoteEnvError(f"no openenv server at {url}: {getattr(error, 'reason', error)}") from error
    except ValidationError as error:
        raise RemoteEnvError(f"openenv server at {url}: {ATTRIBUTES_ROUTE} is not an env description "
                             f"({error.error_count()} errors)") from error


class OpenEnvTextEnv(TextEnv):
    """A remote OpenEnv env at ``url``, played one session at a time."""

    def __init__(self, url: str, connect_timeout: float = 10.0, message_timeout: float = 120.0, retries: int = 3,
                 backoff: float = 1.0, max_turns: int = 50):
        super().__init__()
        if retries < 1:
            raise UserValueError(f"retries must be >= 1, got {retries}")
        self.url, self.connect_timeout, self.message_timeout = http_url(url), connect_timeout, message_timeout
        self.retries, self.backoff = retries, backoff
        attributes = fetch_attributes(self.url, connect_timeout)
        self.max_turns = attributes.max_turns if attributes else max_turns
        self._task_ids = attributes.task_ids if attributes else None
        if attributes:
            self.system_prompt, self.answer_format = attributes.system_prompt, attributes.answer_format
            self.action_template, self.reward_bounds = attributes.action_template, attributes.reward_bounds
        self._client: Any = None

    def task_ids(self) -> list[str]:
        if self._task_ids is None:
            raise NotImplementedError(f"the openenv server at {self.url} does not list its tasks")
        return list(self._task_ids)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        request: dict[str, Any] = {"seed": seed} if seed is not None else {}
        if (options or {}).get("task_id") is not None:
            request["task_id"] = options["task_id"]
        delay = self.backoff
        for attempt in range(1, self.retries + 1):
            try:
                if self._client is None:  # the session (and its env process) lives on across episodes
                    self._client = GenericEnvClient(self.url, connect_timeout_s=self.connect_timeout,
                                                    message_timeout_s=self.message_timeout).sync()
                    self._client.connect()
                text, _ = self._read(self._client.reset(**request))
                return text, self._info
            except RemoteEnvError:
                raise
            except Exception as error:  # refused, dropped, timed out, or an error reply
                error = self._refusal() or error
                self._hang_up()
                if attempt == self.retries or (_is_reply_error(error) and "CAPACITY_REACHED" not in str(error)):
                    raise RemoteEnvError(f"openenv server at {self.url}: reset failed after {attempt} "
                                         f"tries: {_one_line(error)}") from error
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._client is None:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset() (or after a lost episode)")
        try:
            result = self._client.step({"text": action})
        except Exception as error:
            self._hang_up()
            raise RemoteEnvError(f"openenv server at {self.url} lost the episode: {_one_line(error)}") from error
        text, truncated = self._read(result)  # the server sets truncated only on an episode's last step
        return text, float(result.reward or 0.0), bool(result.done) and not truncated, truncated, self._info

    def _read(self, result: Any) -> tuple[str, bool]:
        observation = result.observation
        if not isinstance(observation, dict):
            raise RemoteEnvError(f"openenv server at {self.url} sent an observation that is not an object: {observation!r:.80}")
        text = observation.get("text")
        if text is None:  # another OpenEnv env: its observation as JSON
            text = json.dumps(observation, sort_keys=True)
        try:
            self._info = info_of(observation)
        except (KeyError, TypeError, ValueError) as error:
            raise RemoteEnvError(f"openenv server at {self.url} sent a malformed verdict: {_one_line(error)}") from error
        return str(text), bool(observation.get("truncated", False))

    def _refusal(self) -> Exception | None:
        """The error a server sent as it closed a new session (``CAPACITY_REACHED``), if any:
        it arrives before the reset that then finds the connection closed."""
        try:
            reply = self._client._run(self._client.async_client._receive())
        except Exception:  # nothing was left to read
            return None
        if isinstance(reply, dict) and reply.get("type") == "error":
            data = reply.get("data") or {}
            return RuntimeError(f"Server error: {data.get('message')} (code: {data.get('code')})")
        return None

    def _hang_up(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # already gone: nothing left to free
                pass
            self._client = None

    def close(self) -> None:
        self._hang_up()
        super().close()


def _is_reply_error(error: Exception) -> bool:
    """The server answered with an error (not worth retrying), as opposed to not answering."""
    return str(error).startswith("Server error:")


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]
