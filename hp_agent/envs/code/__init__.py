"""Single-step code environment: the observation is a programming problem, the action a
Python program in a fenced code block, checked against tests in a sandbox."""

from hp_agent.envs.code.env import CodeEnv

__all__ = ["CodeEnv"]
