"""Checks of scalar hyperparameters, with one message naming the field, the value and the range.

Estimators, losses and the train-step builder call `check_range` on plain Python numbers
(hyperparameters are static, so the check runs once when a function is traced, never per step):

    check_range("gamma", gamma, 0.0, 1.0)            # gamma=1.5; allowed: in [0, 1]
    check_range("eps", eps, low=0.0, low_open=True)  # eps=-1.0; allowed: > 0
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax


def _fmt(x: float) -> str:
    """A bound in words: a whole number in full (2147483647, not 2.14748e+09), else `:g`."""
    if float(x).is_integer() and abs(x) < 2**53:
        return str(int(x))
    return f"{x:g}"


def describe_range(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> str:
    """The allowed range in words: "> 0", ">= 1", "<= 1", "in [0, 1)"."""
    if low is not None and high is not None:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        return f"in {left}{_fmt(low)}, {_fmt(high)}{right}"
    if low is not None:
        return f"{'>' if low_open else '>='} {_fmt(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {_fmt(high)}"
    return "a finite number"


def check_range(
    field: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
    note: str = "",
) -> None:
    """Raises ValueError unless `value` is a finite number in the given range.

    Args:
      field: the name the message uses ("gamma", "train.eval_every").
      value: a real number (bools and strings are refused), or None if `allow_none`. A traced
        value (a hyperparameter vmapped over) is not checked.
      low, high: bounds; None for none.
      low_open, high_open: exclude the bound itself.
      allow_none: None is allowed (an option that is off).
      note: appended to the allowed range, e.g. "(0 = off)".

    Raises:
      ValueError: "{field}={value!r}; allowed: {range}".
    """
    if (value is None and allow_none) or isinstance(value, jax.core.Tracer):
        return
    allowed = describe_range(low, high, low_open=low_open, high_open=high_open)
    if allow_none:
        allowed += " or None"
    if note:
        allowed += f" {note}"
    if isinstance(value, jax.Array | numbers.Real) and getattr(value, "shape", ()) == ():
        value = value.item() if hasattr(value, "item") else value
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        bounded = low is not None or high is not None
        if bounded and isinstance(value, float) and not math.isfinite(value):
            allowed = f"a finite number {allowed}"  # "inf; allowed: > 0" would read as allowed
        raise ValueError(f"{field}={value!r}; allowed: {allowed}")
