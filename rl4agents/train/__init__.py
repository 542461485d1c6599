"""Training: resolving a config (`resolve`), the train step, the experiment and its rollout
backends ("jax": `experiment`, "host": `host_run`), metric writers and the driver (`loop`).

Importing the package registers both rollout backends in `resolve.BACKENDS`.
"""

from rl4agents.train import experiment, host_run  # noqa: F401 (register the rollout backends)
