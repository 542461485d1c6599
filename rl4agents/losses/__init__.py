"""Policy/value losses, loss aggregation and regularizers.

Policy losses and aggregation modes are selected by name through `rl4agents.losses.registry`.
The aggregation function is `rl4agents.losses.aggregate.aggregate` (not re-exported here, so
the name `losses.aggregate` keeps meaning the module).
"""

from rl4agents.losses import aggregate, policy, regularizers  # noqa: F401  (registers variants)
from rl4agents.losses.policy import ppo_clip, value_loss
from rl4agents.losses.registry import AGGREGATIONS, POLICY_LOSSES, defaults, get, names, validate
from rl4agents.losses.regularizers import (
    KL_KINDS,
    entropy_from_logits,
    kl_penalty,
    token_entropy,
)

__all__ = [
    "AGGREGATIONS",
    "KL_KINDS",
    "POLICY_LOSSES",
    "defaults",
    "entropy_from_logits",
    "get",
    "kl_penalty",
    "names",
    "ppo_clip",
    "token_entropy",
    "validate",
    "value_loss",
]
