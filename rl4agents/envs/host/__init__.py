"""Host environments: gymnasium-style Python text environments, stepped outside `jit`.

`TextEnv` is the protocol (`reset(seed) -> text`, `step(text) -> (text, reward, done)` or a
gym/gymnasium 4/5-tuple), `HostPool` runs one instance per episode on worker threads with a
per-call timeout, and `host_rollout` samples each turn's actions in one jitted, batched
function with the KV cache kept on the device, producing the same `Trajectory` as the jitted
rollout. `TextArenaEnv` adapts the single-player games of the `textarena` package.
See docs/host_envs.md.
"""

from rl4agents.envs.host import (
    registry,  # noqa: F401 (module: factories by name)
    train,  # noqa: F401 (module: step_config, host_train_step)
)
from rl4agents.envs.host.base import (
    StepResult,
    TextEnv,
    normalize_reset,
    normalize_step,
    text_anchor,
)
from rl4agents.envs.host.pool import Failure, HostPool, HostSpec, Outcome
from rl4agents.envs.host.rollout import (
    HostInfo,
    host_rollout,
    host_rollout_info,
    prefill_prompt,
    sample_turn,
    task_seeds,
)
from rl4agents.envs.host.textarena_env import TextArenaEnv, bracket_action

__all__ = [
    "Failure",
    "HostInfo",
    "HostPool",
    "HostSpec",
    "Outcome",
    "StepResult",
    "TextArenaEnv",
    "TextEnv",
    "bracket_action",
    "host_rollout",
    "host_rollout_info",
    "normalize_reset",
    "normalize_step",
    "prefill_prompt",
    "registry",
    "sample_turn",
    "task_seeds",
    "text_anchor",
    "train",
]
