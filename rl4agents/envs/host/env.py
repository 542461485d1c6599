"""`HostEnv`: host (Python) text environments as the registered environment "host".

`env.name="host"` selects it like any other environment; its registry entry declares the
"host" rollout backend, so training runs `rl4agents.rollout.host` (each turn's sampling one
jitted program, the environments stepped on worker threads) instead of the jitted rollout.
The environment itself is the static geometry and tokenizer of its episodes (what
`rollout.make_layout` and the update read) and the factory that makes a `HostPool`'s games
for each split.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from rl4agents import text
from rl4agents.envs import registry as env_registry
from rl4agents.envs.host import pool as pool_lib
from rl4agents.envs.host import registry

NAME = "host"


@env_registry.register(NAME, backend="host", minimal_vocab=False)
class HostEnv:
    """Python text environments made by a factory (`env.host.*` in a config).

    Args:
      factory: a registered host factory (`envs.host.registry`, e.g. "textarena") or a
        "package.module:function" path.
      args: the factory's keyword arguments (`env.host.args`).
      max_prompt_len: reset-observation tokens kept (longer ones clipped).
      max_obs_len: observation tokens kept per turn.
      num_workers: environments stepped at the same time.
      step_timeout_s: a call over this ends its episode (flagged failure).
      failure_reward: reward of the transition in which an episode failed.
      tokenizer: the run's tokenizer (default: the built-in one).

    Raises:
      ValueError: no or an unknown factory, its arguments, a size below 1, a timeout <= 0,
        or a factory with no training split; each naming the `env.host` field.
    """

    max_action_len = 1  # host environments parse any action text

    def __init__(
        self,
        factory: str = "",
        args: Mapping[str, Any] = types.MappingProxyType({}),
        max_prompt_len: int = 256,
        max_obs_len: int = 64,
        num_workers: int = 8,
        step_timeout_s: float = 30.0,
        failure_reward: float = 0.0,
        tokenizer: Any = None,
    ):
        if not factory:
            raise ValueError(
                "env.name='host' needs env.host.factory; allowed: one of "
                f"{registry.names()} or 'package.module:function'"
            )
        args = registry.validate(factory, dict(args or {}))
        sizes = dict(max_prompt_len=max_prompt_len, max_obs_len=max_obs_len)
        for field, value in {**sizes, "num_workers": num_workers}.items():
            if value < 1:
                raise ValueError(f"env.host.{field}={value}; allowed: >= 1")
        if step_timeout_s <= 0:
            raise ValueError(f"env.host.step_timeout_s={step_timeout_s}; allowed: > 0")
        self.factory = factory
        self.args = tuple(sorted(args.items()))
        self.max_prompt_len = max_prompt_len
        self.max_obs_len = max_obs_len
        self.num_workers = num_workers
        self.step_timeout_s = float(step_timeout_s)
        self.failure_reward = float(failure_reward)
        self.tokenizer = tokenizer or text.BuiltinTokenizer()
        if self.factory_for("train") is None:
            raise ValueError(f"env.host.factory={factory!r} returned no training environments")

    def default_params(self, split: str) -> None:
        del split
        return None

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits the factory makes games for."""
        return tuple(s for s in registry.SPLITS if self.factory_for(s) is not None)

    def factory_for(self, split: str):
        """`task -> TextEnv` for `split`, or None when the factory has no such split."""
        return registry.make_factory(self.factory, split, dict(self.args))

    def make_pool(self, split: str) -> pool_lib.HostPool:
        """A `HostPool` running this environment's games of `split`.

        Raises:
          ValueError: the factory has no such split.
        """
        factory = self.factory_for(split)
        if factory is None:
            raise ValueError(
                f"split={split!r}: env.host.factory={self.factory!r} has no such split; "
                f"allowed: {list(self.splits)}"
            )
        return pool_lib.HostPool(
            factory,
            max_prompt_len=self.max_prompt_len,
            max_obs_len=self.max_obs_len,
            num_workers=self.num_workers,
            step_timeout_s=self.step_timeout_s,
            failure_reward=self.failure_reward,
        )
