"""The host text-environment protocol and the normalisation of what such environments return.

A host environment is ordinary Python that reads and writes strings; it runs outside `jit`,
one instance per episode. Two call shapes are accepted, so that gymnasium-style text
environments plug in unchanged:

  reset(seed=int) -> str | (str, info)
  step(action_text) -> (obs, reward, done)
                     | (obs, reward, done, info)                     (gym < 0.26)
                     | (obs, reward, terminated, truncated, info)    (gymnasium)

`info` may carry `success` (bool: the task was solved; default False) and `valid_action` (bool:
the action parsed; default True, or `not info["invalid_action"]`). A gymnasium `truncated`
(the environment's own time limit) ends the episode like `terminated`.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, NamedTuple, Protocol


class TextEnv(Protocol):
    """One episode of a text environment, stepped on the host (see the module docstring)."""

    def reset(self, seed: int) -> Any: ...

    def step(self, action: str) -> tuple: ...


class StepResult(NamedTuple):
    """One normalised environment transition (host Python values, one episode)."""

    obs: str  # text appended to the context
    reward: float  # finite reward of the transition (0.0 at reset)
    done: bool  # the episode ended (terminated or truncated by the environment)
    success: bool  # the task was solved (metrics only; never shown to the policy)
    valid_action: bool  # the action parsed (True at reset)


def _info_flags(info: Any) -> tuple[bool, bool]:
    """(success, valid_action) from an info dict; defaults (False, True)."""
    if not isinstance(info, dict):
        return False, True
    valid = info.get("valid_action", not info.get("invalid_action", False))
    return bool(info.get("success", False)), bool(valid)


def _check_obs(obs: Any, where: str) -> str:
    if not isinstance(obs, str):
        raise TypeError(f"{where} returned an observation of type {type(obs).__name__}, not str")
    return obs


def normalize_reset(out: Any) -> StepResult:
    """Normalise what `reset` returned: a str or a (str, info) pair.

    Raises:
      TypeError: the observation is not a string or the pair has another length.
    """
    info = None
    if isinstance(out, tuple):
        if len(out) != 2:
            raise TypeError(f"reset returned a tuple of {len(out)} items; expected (obs, info)")
        out, info = out
    success, _ = _info_flags(info)
    return StepResult(_check_obs(out, "reset"), 0.0, False, success, True)


def normalize_step(out: Any) -> StepResult:
    """Normalise what `step` returned: a 3-, 4- (gym) or 5-tuple (gymnasium).

    Raises:
      TypeError: not a tuple of 3 to 5 items, or the observation is not a string.
      ValueError: the reward is not a finite number.
    """
    if not isinstance(out, tuple) or not 3 <= len(out) <= 5:
        raise TypeError(
            "step must return (obs, reward, done), (obs, reward, done, info) or "
            f"(obs, reward, terminated, truncated, info); got {type(out).__name__} {out!r:.80}"
        )
    if len(out) == 5:
        obs, reward, terminated, truncated, info = out
        done = bool(terminated) or bool(truncated)
    else:
        obs, reward, done = out[:3]
        info = out[3] if len(out) == 4 else None
    reward = float(reward)
    if not math.isfinite(reward):
        raise ValueError(f"step returned a non-finite reward {reward}")
    success, valid = _info_flags(info)
    return StepResult(_check_obs(obs, "step"), reward, bool(done), success, valid)


def text_anchor(text: str) -> int:
    """Exact hash of an observation text: CRC-32 of its UTF-8 bytes, a uint32 as a Python int.

    Stable across processes (unlike `hash`), so step-level grouping (GiGPO anchors) can compare
    the states of different episodes and batches.
    """
    return zlib.crc32(text.encode("utf-8")) & 0xFFFFFFFF
