"""Jitted multi-turn rollout."""
