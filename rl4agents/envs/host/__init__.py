"""Host environments: gymnasium-style Python text environments, stepped outside `jit`.

`TextEnv` is the protocol (`reset(seed) -> text`, `step(text) -> (text, reward, done)` or a
gym/gymnasium 4/5-tuple), `HostPool` runs one instance per episode on worker threads with a
per-call timeout, and `HostEnv` is the registered environment "host" whose factory
(`registry`) makes them; its rollout backend is `rl4agents.rollout.host`, which samples each
turn's actions in one jitted, batched function and produces the same `Trajectory` as the
jitted rollout. `TextArenaEnv` adapts the single-player games of the `textarena` package.
See docs/host_envs.md.
"""

from rl4agents.envs.host import registry  # noqa: F401 (module: factories by name)
from rl4agents.envs.host.base import (
    StepResult,
    TextEnv,
    normalize_reset,
    normalize_step,
    text_anchor,
)
from rl4agents.envs.host.env import HostEnv
from rl4agents.envs.host.pool import Failure, HostPool, HostSpec, Outcome
from rl4agents.envs.host.textarena_env import TextArenaEnv, bracket_action

__all__ = [
    "Failure",
    "HostEnv",
    "HostPool",
    "HostSpec",
    "Outcome",
    "StepResult",
    "TextArenaEnv",
    "TextEnv",
    "bracket_action",
    "normalize_reset",
    "normalize_step",
    "registry",
    "text_anchor",
]
