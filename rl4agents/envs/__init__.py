"""Built-in environments; importing this package registers each of them by name."""

from rl4agents.envs import (
    frozen_lake,  # noqa: F401 (registers "frozen_lake")
    sokoban,  # noqa: F401 (registers "sokoban")
)
from rl4agents.envs.registry import make, names, register

__all__ = ["make", "names", "register"]
