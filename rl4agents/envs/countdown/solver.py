"""Host-side Countdown solvers: the shortest calc sequence to a target (the oracle) and every
number reachable from a start (the fallback task's check)."""

from __future__ import annotations

import collections
import itertools

from rl4agents.envs.countdown.world import OPS


def solve(
    numbers: tuple[int, ...], target: int, max_value: int, num_slots: int
) -> list[tuple[int, str, int]] | None:
    """Shortest calc sequence (host side, breadth-first over multisets) that makes the target.

    Args:
      numbers: the numbers held.
      target: the target.
      max_value: largest allowed result.
      num_slots: N, the number of starting numbers (the goal needs at least one calc made,
        i.e. fewer than N numbers held).

    Returns:
      [(a, op, b), ...] calcs with a >= b, after which the target is held; None if impossible.
    """
    start = tuple(sorted(numbers))
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        held = queue.popleft()
        if target in held and len(held) < num_slots:
            plan = []
            while parent[held] is not None:
                held, calc = parent[held]
                plan.append(calc)
            return plan[::-1]
        for i, j in itertools.combinations(range(len(held)), 2):
            small, large = held[i], held[j]  # held is sorted
            rest = held[:i] + held[i + 1 : j] + held[j + 1 :]
            for op, result in zip(OPS, (large + small, large - small, large * small)):
                child = tuple(sorted(rest + (result,)))
                if result <= max_value and child not in parent:
                    parent[child] = (held, (large, op, small))
                    queue.append(child)
    return None


def reachable(numbers: tuple[int, ...], max_value: int) -> set[int]:
    """Every number held after one or more calcs from `numbers` (host side)."""
    seen, queue, values = {tuple(sorted(numbers))}, [tuple(sorted(numbers))], set()
    while queue:
        held = queue.pop()
        for i, j in itertools.combinations(range(len(held)), 2):
            small, large = held[i], held[j]
            rest = held[:i] + held[i + 1 : j] + held[j + 1 :]
            for result in (large + small, large - small, large * small):
                child = tuple(sorted(rest + (result,)))
                if result <= max_value and child not in seen:
                    seen.add(child)
                    values.update(child)
                    queue.append(child)
    return values
