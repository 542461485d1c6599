"""Credit assignment: advantage estimators selected by name (see `registry`).

Importing this package registers every variant module.
"""

from rl4agents.credit import opo, outcome, steps, token  # noqa: F401  (registers variants)
from rl4agents.credit.registry import (
    CreditFn,
    CreditOutput,
    declare,
    defaults,
    fields,
    get,
    names,
    register,
    requires_greedy,
    requires_groups,
    requires_values,
    validate,
)

# Estimators whose baseline compares the samples of one task: they need group_size >= 2.
for _name in (
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp_baseline",
    "gigpo",
    "mt_grpo",
    "empg",
    "opo",
):
    declare(_name, needs_groups=True)

__all__ = [
    "CreditFn",
    "CreditOutput",
    "declare",
    "defaults",
    "fields",
    "get",
    "names",
    "register",
    "requires_greedy",
    "requires_groups",
    "requires_values",
    "validate",
]
