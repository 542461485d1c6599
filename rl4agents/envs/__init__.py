"""Built-in environments; importing this package registers each of them by name (the
jitted ones and "host", Python text environments; `registry.backend(name)` tells which)."""

from rl4agents.envs import (  # noqa: F401 (each module registers its environment by name)
    countdown,
    frozen_lake,
    guess_number,
    host,
    household,
    maze,
    search_qa,
    sokoban,
    terminal,
    two_agent,
    web_shop,
    wordle,
)
from rl4agents.envs.registry import make, names, register

__all__ = ["make", "names", "register"]
