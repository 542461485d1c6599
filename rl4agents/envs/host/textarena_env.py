"""TextArena's single-player games as `TextEnv`s (the `textarena` package from PyPI).

TextArena (https://github.com/LeonGuertler/TextArena) is a collection of text games: puzzles
such as GuessTheNumber, FrozenLake, TowerOfHanoi, Mastermind, Minesweeper and many two-player
games. Its environments are stateful Python objects driven by
`reset(num_players, seed) / step(action) -> (done, info) / get_observation() / close()`, and
they speak in tagged messages. `TextArenaEnv` adapts one single-player game:

- observations are the messages the game sent since the last turn (the prompt and board at
  reset; hints, invalid-move notices and boards later), joined by newlines; the player's own
  action is not echoed back (it is already in the context). When the game ends its reason
  ("Congratulations! ...") is appended;
- the reward is TextArena's final reward of player 0 (0 on earlier turns), and `success` is a
  final reward of at least 1 (a win);
- an action TextArena rejected as invalid has `valid_action=False`;
- actions are passed through `format_action`, by default `bracket_action`: TextArena reads the
  move inside square brackets ("[up]", "[A C]").

TextArena seeds Python's global `random` module in `reset`, so calls into its games hold one
lock: episodes stay reproducible from their seeds when a `HostPool` runs them on threads.
The `textarena` package is imported on first use; `pip install rl4agents[host]` installs it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from rl4agents.envs.host import registry

_LOCK = threading.Lock()  # TextArena's games share Python's global `random` state


def bracket_action(text: str) -> str:
    """Put an action in TextArena's move format: "up" -> "[up]", "[ 5 ]" -> "[5]".

    Text that already holds a bracket keeps its words, with spaces next to the brackets
    removed (word-level tokenizers decode "[up]" as "[ up ]").
    """
    text = " ".join(text.split())
    if "[" not in text:
        return f"[{text}]"
    return re.sub(r"\s*\]", "]", re.sub(r"\[\s*", "[", text))


class TextArenaEnv:
    """One single-player TextArena game as a `TextEnv` (see the module docstring).

    Args:
      env_id: a registered single-player TextArena id, e.g. "GuessTheNumber-v0".
      format_action: maps the decoded action text to what the game receives.
    """

    def __init__(self, env_id: str, format_action: Callable[[str], str] = bracket_action):
        import textarena

        env = textarena.make(env_id)
        while isinstance(env, textarena.Wrapper):  # raw messages, not a wrapper's rendering
            env = env.env
        self.env_id = env_id
        self.format_action = format_action
        self._env = env
        self._ta = textarena

    def _messages(self) -> str:
        _, messages = self._env.get_observation()
        skip = self._ta.ObservationType.PLAYER_ACTION
        return "\n".join(m.strip() for _, m, kind in messages if kind != skip and m.strip())

    def reset(self, seed: int) -> str:
        """Start a game from `seed`; returns the prompt (and board) text."""
        with _LOCK:
            self._env.reset(num_players=1, seed=int(seed))
            return self._messages()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Play one move; returns (observation text, reward, done, info)."""
        with _LOCK:
            done, _ = self._env.step(self.format_action(action))
            obs = self._messages()
            state = self._env.state
            # A rejected move leaves error_count > 0 (a valid one resets it to 0).
            invalid = getattr(state, "error_count", 0) > 0
            reward = 0.0
            if done:
                rewards, game_info = self._env.close()
                reward = float((rewards or {}).get(0, 0.0))
                info0 = game_info.get(0, {})
                invalid = invalid or bool(info0.get("invalid_move", False))
                if info0.get("reason"):
                    obs = f"{obs}\n{info0['reason']}" if obs else str(info0["reason"])
        return (
            obs,
            reward,
            bool(done),
            {"success": done and reward >= 1.0, "valid_action": not invalid},
        )


@registry.register("textarena")
def textarena_games(
    split: str, games: str = "GuessTheNumber-v0", ood_games: str = "GuessTheNumber-v0-hardcore"
) -> Callable[[int], TextArenaEnv] | None:
    """A config's TextArena factory: task t of a batch plays game t mod len(games).

    Args:
      split: "train" and "test" play `games` (test from held-out seeds); "ood" plays
        `ood_games` ("" = no OOD split).
      games: comma-separated single-player TextArena ids.
      ood_games: comma-separated ids for the OOD split.
    """
    ids = [g.strip() for g in (ood_games if split == "ood" else games).split(",") if g.strip()]
    if not ids:
        return None
    return lambda task: TextArenaEnv(ids[task % len(ids)])
