"""Single-step math environment: the observation is a word problem, the action a worked
answer ending in ``\\boxed{...}``, checked against the exact reference answer."""

from hp_agent.envs.math.env import MathEnv

__all__ = ["MathEnv"]
