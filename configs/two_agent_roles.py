"""Two-agent guide/walker cooperation with one parameter set per role (AT-GRPO's multi-policy
setting, arXiv 2510.11062) instead of one shared policy.

  python scripts/train.py --config=configs/two_agent_roles.py --workdir=runs/two_agent_roles

The guide (even turns) and the walker (odd turns) each get their own parameters
(`model.role_params=2`, `rl4agents.models.roles`), both starting from the same initialisation;
credit is `at_grpo` (groups by task, agent and turn). The argument selects another credit
variant (critic-free ones only: role sets take no value head). The swapped-roles control
evaluates the trained sets in each other's seat: `Experiment.eval_fn(split, n,
swap_roles=True)`.
"""

from __future__ import annotations

from configs import two_agent


def get_config(arg: str | None = None):
    c = two_agent.get_config(arg or "at_grpo")
    c.unlock()
    c.model.role_params = 2
    c.lock()
    return c
