"""Multi-process (multi-host) runs: start `jax.distributed`, and the helpers a host loop needs.

One JAX program spans every process: each process runs the same Python code, owns its local
devices, and `jax.jit` programs over a mesh of all devices (`jax.devices()`) are collective.
Arrays are global; a process can read only the shards on its own devices. The loop therefore
fetches metrics with `to_host` (replicated or gathered), does its file I/O (metrics, plots,
`summary.json`) on process 0 only (`is_main`), and takes host-side control-flow decisions
(stop on SIGTERM or wall time) together (`any_process`) so that no process leaves a collective
program that the others enter.

`initialize` must run before anything touches a JAX backend (`jax.devices()`, an array).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np


def detect_cluster() -> str | None:
    """Names the launcher of a multi-process job that `jax.distributed` can read, or None.

    Only jobs with more than one process count; a single task under SLURM or `mpirun -n 1`
    is a single-process run and needs no initialization.

    Returns:
      "slurm" (SLURM_NTASKS > 1 with the variables JAX's SlurmCluster reads), "ompi"
      (`mpirun`/`mpiexec` of Open MPI with OMPI_COMM_WORLD_SIZE > 1), "tpu" (a Cloud TPU VM,
      whose slice JAX reads from the metadata server; a one-host slice becomes a one-process
      cluster), or None.
    """
    env = os.environ
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID")
    if all(v in env for v in slurm) and int(env.get("SLURM_NTASKS", "1")) > 1:
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in env and int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return "ompi"
    try:  # set by `import jax` when libtpu and TPU chips are present
        from jax._src import cloud_tpu_init

        if cloud_tpu_init.running_in_cloud_tpu_vm:
            return "tpu"
    except ImportError:  # a JAX without this module: TPU needs coordinator="auto"
        pass
    return None


def initialize(coordinator: str = "", num_processes: int = 0, process_id: int = -1) -> bool:
    """Starts `jax.distributed` from explicit settings or the cluster environment.

    Call once per process, before any JAX backend use. With every argument at its default
    and no cluster detected (`detect_cluster`), nothing happens (a single-process run).

    Args:
      coordinator: "host:port" of process 0's coordination service; "" = from the
        environment; "auto" = call `jax.distributed.initialize()` with no arguments and let
        JAX detect the cluster (SLURM, Open MPI, Cloud TPU, Kubernetes) even where
        `detect_cluster` finds none.
      num_processes: number of processes; 0 = from the environment.
      process_id: this process's index in [0, num_processes); -1 = from the environment.

    Returns:
      True if `jax.distributed` was initialized by this call (or already was).

    Raises:
      ValueError: explicit settings that are incomplete or inconsistent.
    """
    if jax.distributed.is_initialized():
        return True
    explicit = bool(coordinator and coordinator != "auto") or num_processes > 0
    if explicit:
        if num_processes > 0 and not 0 <= process_id < num_processes:
            raise ValueError(
                f"distributed.process_id={process_id} with distributed.num_processes="
                f"{num_processes}; allowed: 0..{num_processes - 1}"
            )
        if num_processes == 1:
            return False  # one process: nothing to coordinate
        jax.distributed.initialize(
            coordinator_address=coordinator or None,
            num_processes=num_processes or None,
            process_id=process_id if process_id >= 0 else None,
        )
        return True
    if coordinator == "auto" or detect_cluster() is not None:
        jax.distributed.initialize()
        return True
    return False


def is_main() -> bool:
    """True on process 0, the one process that logs, prints and writes summaries."""
    return jax.process_index() == 0


def to_host(tree: Any) -> Any:
    """Fetches a pytree of (possibly global, multi-process) arrays as NumPy arrays.

    A fully addressable or fully replicated array is read from local devices; an array
    sharded across processes is gathered with `process_allgather` (a collective: every
    process must call this with the same tree).

    Args:
      tree: pytree of `jax.Array`s (any shape/dtype) or host values.

    Returns:
      The same tree of `np.ndarray`s, each the full global value.
    """

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(jax.device_get(x))
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def any_process(flags: Sequence[bool]) -> list[bool]:
    """Each flag OR-ed over all processes (one collective when there are several).

    Host decisions that change which jitted programs run next (stop now, evaluate now) must
    agree across processes, or the processes that go on wait forever in a collective.

    Args:
      flags: this process's decisions.

    Returns:
      `[any(flag_i over processes) for each i]`; the flags themselves on a single process.
    """
    if jax.process_count() == 1:
        return [bool(f) for f in flags]
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray(flags, np.int32))  # [P, n]
    return [bool(f) for f in np.any(gathered, axis=0)]
