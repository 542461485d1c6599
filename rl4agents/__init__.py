"""rl4agents: JAX-native reinforcement learning for multi-turn LLM agents."""

from rl4agents.types import TimeStep, Trajectory

__all__ = ["TimeStep", "Trajectory"]
