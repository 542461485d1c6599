"""Credit assignment: advantage estimators selected by name (see `registry`).

Importing this package registers every variant module.
"""

from rl4agents.credit import (  # noqa: F401  (registers variants)
    agent_turn,
    opo,
    outcome,
    steps,
    token,
    tree,
)
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
