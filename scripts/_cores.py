"""Import first in a script: one XLA CPU device per core, set before JAX starts.

XLA's CPU fusions are single-threaded, so a data-parallel mesh over one device per core is
what uses every core of a CPU host. Only the host platform is affected; GPUs and TPUs are not.
An explicit `--xla_force_host_platform_device_count` in XLA_FLAGS is left alone.
"""

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={os.cpu_count() or 1}"
    ).strip()
