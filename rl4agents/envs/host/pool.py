"""`HostPool`: B text-environment instances stepped side by side on the host.

A fresh instance is built per episode by a factory, and every call into it (the factory,
`reset`, `step`, `close`) runs on a pool of daemon worker threads under a per-call timeout. A
call that raises or overruns ends that episode only: it comes back as a `Failure` with the
environment's part of the transition replaced by a terminal one (empty observation, reward
`failure_reward`), and the instance is abandoned. Python cannot stop a thread, so a timed-out
call keeps its worker until it returns (the worker then retires); the pool starts a
replacement worker at once, and the threads are daemons, so a call that never returns cannot
keep the process alive.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from rl4agents.envs.host import base

_POLL_S = 0.02  # how often to look at calls that have not started yet


class Failure(NamedTuple):
    """An environment call that raised or timed out; it ended its episode."""

    episode: int  # row of the batch
    turn: int  # turn whose step failed; -1 for the factory or `reset`
    kind: str  # "exception" | "timeout"
    message: str  # the exception (type, message, innermost frame) or the time limit


class Outcome(NamedTuple):
    """The normalised result of one call, or the terminal stand-in for a failed one."""

    result: base.StepResult
    failure: Failure | None  # None when the call succeeded


class _Workers:
    """Daemon threads fed from one queue; a worker stuck in an abandoned call is replaced."""

    def __init__(self, num_workers: int):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0
        for _ in range(num_workers):
            self._spawn()

    def _spawn(self):
        with self._lock:
            self._live += 1
        threading.Thread(target=self._loop, daemon=True, name="rl4agents-host-env").start()

    def _loop(self):
        while True:
            item = self._tasks.get()
            if item is None:
                break
            fut, fn = item
            if not fut.set_running_or_notify_cancel():
                continue
            fut.started_at = time.monotonic()
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 (any environment error is a failure)
                fut.set_exception(e)
            with self._lock:
                if fut.abandoned:  # a replacement took this worker's place while it was stuck
                    break
        with self._lock:
            self._live -= 1

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.started_at, fut.abandoned = None, False
        self._tasks.put((fut, fn))
        return fut

    def abandon(self, fut: concurrent.futures.Future):
        """Give up on a running call: its worker retires when (if) it returns; start another."""
        with self._lock:
            if fut.done():  # it finished meanwhile: its worker is free again
                return
            fut.abandoned = True
        self._spawn()

    def close(self):
        with self._lock:
            live = self._live
        for _ in range(live):
            self._tasks.put(None)


def _describe(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """The static geometry of host episodes; stands in for `env` in `rollout.make_layout` and in
    `StepConfig.env` (the learning step only reads these sizes)."""

    max_prompt_len: int  # P - 1: reset-observation tokens kept (BOS takes the first slot)
    max_obs_len: int  # O: observation tokens kept per turn
    max_action_len: int = 1  # host environments parse any action text

    def default_params(self, split: str) -> None:
        """Host environments carry their settings themselves: no params pytree."""
        del split
        return None


class HostPool:
    """Runs the B episodes of a batch, one fresh `TextEnv` each, on host threads.

    Args:
      factory: `factory(task) -> TextEnv` builds the environment of one episode; `task` is the
        episode's group index in the batch (0..num_tasks-1), so one pool can mix several games.
        Called once per episode, on a worker, under the time limit.
      max_prompt_len: reset-observation tokens kept (longer prompts are clipped and flagged).
      max_obs_len: O, observation tokens kept per turn (longer ones are clipped and flagged).
      num_workers: worker threads (environments stepped at the same time).
      step_timeout_s: time limit of one call (factory, reset, step or close), measured from
        when the call starts on a worker.
      failure_reward: reward of the transition in which an episode failed (0 or a penalty).
    """

    def __init__(
        self,
        factory: Callable[[int], Any],
        *,
        max_prompt_len: int,
        max_obs_len: int,
        num_workers: int = 8,
        step_timeout_s: float = 30.0,
        failure_reward: float = 0.0,
    ):
        for name, value in (("max_prompt_len", max_prompt_len), ("max_obs_len", max_obs_len)):
            if value < 1:
                raise ValueError(f"HostPool {name}={value}; allowed: >= 1")
        if num_workers < 1 or step_timeout_s <= 0:
            raise ValueError(
                f"HostPool num_workers={num_workers}, step_timeout_s={step_timeout_s}; "
                "allowed: num_workers >= 1 and step_timeout_s > 0"
            )
        self.factory = factory
        self.spec = HostSpec(max_prompt_len, max_obs_len)
        self.step_timeout_s = float(step_timeout_s)
        self.failure_reward = float(failure_reward)
        self._workers = _Workers(num_workers)
        self._envs: list[Any] = []

    @property
    def max_prompt_len(self) -> int:
        return self.spec.max_prompt_len

    @property
    def max_obs_len(self) -> int:
        return self.spec.max_obs_len

    @property
    def max_action_len(self) -> int:
        return self.spec.max_action_len

    def _run(self, calls: dict[int, Callable[[], Any]]) -> dict[int, tuple[Any, str, str]]:
        """Run calls on the workers; {i: (value, "", "")} or {i: (None, kind, message)}."""
        timeout = self.step_timeout_s
        pending = {i: self._workers.submit(fn) for i, fn in calls.items()}
        out = {}
        while pending:
            now = time.monotonic()
            for i, fut in list(pending.items()):
                if fut.done():
                    e = fut.exception()
                    out[i] = (
                        (fut.result(), "", "") if e is None else (None, "exception", _describe(e))
                    )
                elif fut.started_at is not None and now - fut.started_at > timeout:
                    out[i] = (None, "timeout", f"no answer within {timeout:g} s")
                    self._workers.abandon(fut)
                else:
                    continue
                del pending[i]
            if pending:
                started = [f.started_at for f in pending.values() if f.started_at is not None]
                wait_s = min(started) + timeout - now if started else _POLL_S
                if len(started) < len(pending):
                    wait_s = min(wait_s, _POLL_S)
                concurrent.futures.wait(list(pending.values()), timeout=max(wait_s, 0.0) + 1e-3)
        return out

    def _outcomes(self, results, turn: int) -> dict[int, Outcome]:
        out = {}
        for i, (value, kind, message) in results.items():
            if kind:
                self._envs[i] = None  # abandoned: possibly still running on a stuck worker
                stand_in = base.StepResult("", self.failure_reward, True, False, True)
                out[i] = Outcome(stand_in, Failure(i, turn, kind, message))
            else:
                out[i] = Outcome(value, None)
        return out

    def reset(self, tasks: Sequence[int], seeds: Sequence[int]) -> list[Outcome]:
        """Build and reset one environment per episode.

        Args:
          tasks: the task (group index) of each of the B episodes.
          seeds: the reset seed of each episode (the episodes of a task share it).

        Returns:
          B outcomes, in episode order; a failed factory or reset ends its episode at once.
        """
        self.close_episodes()
        self._envs = [None] * len(tasks)

        def make_and_reset(task, seed):
            env = self.factory(task)
            return env, base.normalize_reset(env.reset(seed=seed))

        calls = {
            i: (lambda t=int(t), s=int(s): make_and_reset(t, s))
            for i, (t, s) in enumerate(zip(tasks, seeds))
        }
        results = self._run(calls)
        for i, (value, kind, _) in results.items():
            if not kind:  # only here, on this thread: a late, timed-out call never lands
                self._envs[i], result = value
                results[i] = (result, "", "")
        out = self._outcomes(results, turn=-1)
        return [out[i] for i in range(len(tasks))]

    def step(self, actions: dict[int, str], turn: int) -> dict[int, Outcome]:
        """Step the episodes in `actions` ({episode: action text}) side by side.

        Returns:
          {episode: Outcome}; an episode whose environment was abandoned gets a failure too.
        """
        calls = {}
        for i, action in actions.items():
            env = self._envs[i]
            if env is None:
                raise ValueError(f"episode {i} has no live environment (it ended or failed)")
            calls[i] = lambda env=env, a=action: base.normalize_step(env.step(a))
        return self._outcomes(self._run(calls), turn)

    def close_episodes(self):
        """Close the live environments of the last batch (`close()` where they have one)."""
        calls = {
            i: env.close
            for i, env in enumerate(self._envs)
            if env is not None and callable(getattr(env, "close", None))
        }
        self._run(calls)  # errors and timeouts of close are ignored: the episodes are over
        self._envs = []

    def close(self):
        """Close the environments and stop the workers."""
        self.close_episodes()
        self._workers.close()

    def __enter__(self) -> HostPool:
        return self

    def __exit__(self, *exc):
        self.close()
