"""Policy/value losses, loss aggregation, mismatch corrections, regularizers and shaping.

Policy losses and aggregation modes are selected by name through `rl4agents.losses.registry`.
The aggregation function is `rl4agents.losses.aggregate.aggregate` (not re-exported here, so
the name `losses.aggregate` keeps meaning the module).
"""

from rl4agents.losses import (  # noqa: F401  (registers)
    aggregate,
    mismatch,
    policy,
    regularizers,
    shaping,
)
from rl4agents.losses.policy import (
    cispo,
    gspo,
    ppo_clip,
    reinforce,
    sapo,
    takes_segment_ids,
    tis_weights,
    value_loss,
)
from rl4agents.losses.registry import AGGREGATIONS, POLICY_LOSSES, defaults, get, names, validate
from rl4agents.losses.regularizers import (
    KL_KINDS,
    echo_loss,
    entropy_from_logits,
    kl_penalty,
    token_entropy,
)
from rl4agents.losses.shaping import overlong_penalty

__all__ = [
    "AGGREGATIONS",
    "KL_KINDS",
    "POLICY_LOSSES",
    "cispo",
    "defaults",
    "echo_loss",
    "entropy_from_logits",
    "get",
    "gspo",
    "kl_penalty",
    "names",
    "overlong_penalty",
    "ppo_clip",
    "reinforce",
    "sapo",
    "takes_segment_ids",
    "tis_weights",
    "token_entropy",
    "validate",
    "value_loss",
]
