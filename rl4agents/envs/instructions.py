"""Per-environment instructions: the system prompt a chat model needs to play an environment.

The observations of the built-in environments carry little or no explanation (frozen_lake's
is the grid alone), which a model trained on them learns to read; a pretrained chat model
playing zero-shot needs to be told the task. `get(name, settings)` returns, for each
registered environment, an `Instruction`: 2-6 sentences naming the goal, the notation of the
observation and the action grammar exactly as the environment's parser accepts it, ending
with "Reply with the ... only", for `model.system_prompt`.

The text depends on the environment's settings where the observation does (a compact grid
has no row breaks, the view radius sets the window). Quoted strings in the text are either
example actions (`Instruction.examples`, each a valid action of that environment) or
observation symbols (`Instruction.symbols`, each shown in the environment's observations);
`tests/envs/test_instructions.py` checks both against the environments themselves. Other
grammar is written with upper-case placeholders (calc A OP B), never quoted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from rl4agents.envs import registry


@dataclasses.dataclass(frozen=True)
class Instruction:
    """A system prompt and what it quotes.

    Attributes:
      text: the system prompt.
      examples: the actions it quotes, spelled as the environment's parser accepts them.
      symbols: the observation symbols and words it quotes and explains.
    """

    text: str
    examples: tuple[str, ...]
    symbols: tuple[str, ...]


_BUILDERS: dict[str, Callable[[Mapping[str, Any]], Instruction]] = {}


def _register(name: str):
    def wrap(fn: Callable[[Mapping[str, Any]], Instruction]):
        if name in _BUILDERS:
            raise ValueError(f"instruction for environment {name!r} already registered")
        _BUILDERS[name] = fn
        return fn

    return wrap


def names() -> list[str]:
    """Sorted names of the environments that have an instruction."""
    return sorted(_BUILDERS)


def get(name: str, settings: Mapping[str, Any] | None = None) -> Instruction:
    """The instruction of environment `name` built with `settings`.

    Args:
      name: a registered environment with an instruction (`names()`).
      settings: constructor arguments of the environment (its `env.<name>` config section);
        missing ones take the constructor's defaults.

    Raises:
      KeyError: `name` has no instruction (the message lists those that do).
      ValueError: a setting the environment does not take (`registry.validate`).
    """
    if name not in _BUILDERS:
        raise KeyError(f"no instruction for environment {name!r}; known: {names()}")
    return _BUILDERS[name](registry.validate(name, dict(settings or {})))


def _q(s: str) -> str:
    return f'"{s}"'


def _quoted(items: tuple[str, ...], last: str = "or") -> str:
    """'"a", "b" or "c"'."""
    parts = [_q(s) for s in items]
    return ", ".join(parts[:-1]) + f" {last} " + parts[-1] if len(parts) > 1 else parts[0]


_MOVES = ("up", "down", "left", "right")


def _layout(side: int, compact: bool) -> str:
    """How a side x side grid is written."""
    if compact:
        return (
            f"its {side * side} cells written row by row with no line breaks (the first {side} "
            "characters are the top row)"
        )
    return "one row of cells per line"


@_register("frozen_lake")
def _frozen_lake(s: Mapping[str, Any]) -> Instruction:
    n, r = s["size"], s["view_radius"]
    if r:
        view = (
            f"the {2 * r + 1}x{2 * r + 1} cells around you (you in the middle, off-grid cells "
            f"{_q('#')}), {_layout(2 * r + 1, s['compact'])}"
        )
        symbols = ("P", "_", "O", "G", "#", "invalid")
    else:
        view = f"the {n}x{n} grid, {_layout(n, s['compact'])}"
        symbols = ("P", "_", "O", "G", "invalid")
    slip = " The ice is slippery: a move may go sideways instead." if s["slippery"] else ""
    text = (
        "You play FrozenLake: walk from the top-left corner to the goal in the bottom-right "
        "corner without falling into a hole. "
        f"Each observation is {view}: {_q('P')} is you, {_q('_')} frozen ice (safe), "
        f"{_q('O')} a hole (falling in ends the game), {_q('G')} the goal. "
        f"Moves: {_quoted(_MOVES)}, one cell each; a move off the grid leaves you in place."
        f"{slip} An observation that starts with {_q('invalid')} means your last reply was not "
        "a move. Reply with the move only."
    )
    return Instruction(text, _MOVES, symbols)


@_register("maze")
def _maze(s: Mapping[str, Any]) -> Instruction:
    side = 2 * s["view_radius"] + 1
    text = (
        "You explore a maze to find the goal. "
        f"Each observation is only the {side}x{side} cells around you, "
        f"{_layout(side, s['compact'])}, with you in the middle: {_q('P')} is you, "
        f"{_q('#')} a wall, {_q('_')} open floor, {_q('G')} the goal (shown only when it is "
        "inside that window). No map or position is given, so remember where you have been "
        f"and do not walk the same dead end twice. Moves: {_quoted(_MOVES)}, one cell each; a "
        "move into a wall leaves you in place. An observation that starts with "
        f"{_q('invalid')} means your last reply was not a move. Reply with the move only."
    )
    return Instruction(text, _MOVES, ("P", "#", "_", "G", "invalid"))


@_register("sokoban")
def _sokoban(s: Mapping[str, Any]) -> Instruction:
    n = s["size"]
    if s["compact"]:
        room = f"the inside of the room (its outer wall left out), {_layout(n - 2, True)}"
    else:
        room = f"the {n}x{n} room, {_layout(n, False)}"
    text = (
        "You play Sokoban: push every box onto a target. "
        f"Each observation is {room}: {_q('@')} is you, {_q('+')} you on a target, "
        f"{_q('$')} a box, {_q('*')} a box on a target, {_q('.')} an empty target, "
        f"{_q('_')} floor, {_q('#')} wall. "
        f"Moves: {_quoted(_MOVES)}; walking into a box pushes it one cell when the cell behind "
        "it is free, boxes cannot be pulled, and every move costs a little. An observation "
        f"that starts with {_q('invalid')} means your last reply was not a move. "
        "Reply with the move only."
    )
    return Instruction(text, _MOVES, ("@", "+", "$", "*", ".", "_", "#", "invalid"))


@_register("wordle")
def _wordle(s: Mapping[str, Any]) -> Instruction:
    text = (
        f"You play Wordle: find the secret 5-letter English word in {s['max_guesses']} guesses. "
        "Guess by replying guess WORD with a common lowercase 5-letter English word, e.g. "
        f"{_q('guess crane')} or {_q('guess slate')}. "
        "After each guess you see every letter of it followed by a mark: "
        f"{_q('+')} right letter in the right place, {_q('?')} in the word but elsewhere, "
        f"{_q('-')} not in the word. Use the marks to choose the next guess. "
        "Reply with the guess only."
    )
    return Instruction(text, ("guess crane", "guess slate"), ("+", "?", "-"))


@_register("countdown")
def _countdown(s: Mapping[str, Any]) -> Instruction:
    text = (
        "You play Countdown with a calculator: combine the numbers you hold to make the target "
        f"number. The observation shows the {_q('target')} and the numbers you hold after "
        f"{_q('left:')}. Each turn reply with one command: calc A OP B, with A and B two "
        "numbers you hold and OP one of + - *, replaces them by the result (which must be "
        f"from 0 to {s['max_value']}), e.g. {_q('calc 3 + 4')}; answer N ends the game, e.g. "
        f"{_q('answer 14')}, and wins when N is the target, you hold it and you made at least "
        "one calc. Reply with the command only."
    )
    return Instruction(text, ("calc 3 + 4", "answer 14"), ("target", "left:"))


@_register("guess_number")
def _guess_number(s: Mapping[str, Any]) -> Instruction:
    n, turns = s["max_value"], s["max_turns"]
    text = (
        f"You play a guessing game: find the secret number from 0 to {n} in {turns} turns. "
        f"Each turn reply with one number, e.g. {_q('7')}. The reply is "
        f"{_q('higher')} when the secret is larger than your guess, {_q('lower')} when it is "
        f"smaller, and {_q('correct')} ends the game with a win. Halve the range of values the "
        "replies still allow with every guess. Reply with the number only."
    )
    return Instruction(text, ("7",), ("higher", "lower", "correct"))


@_register("search_qa")
def _search_qa(s: Mapping[str, Any]) -> Instruction:
    del s
    text = (
        "You answer a question about made-up people with a search tool. The first observation "
        "asks for an attribute (city, employer or birth year) of a person reached through a "
        "chain of relations (manager, friend) from a named person. Each turn reply with one "
        f"command: search NAME lists that person's facts, e.g. {_q('search Zeda')}; "
        f"answer VALUE ends the game, e.g. {_q('answer Orvan')} or {_q('answer 1971')}. "
        "Search the named person, then each person along the chain, and answer with the "
        "value asked for, spelled as in the facts. Reply with the command only."
    )
    return Instruction(text, ("search Zeda", "answer Orvan", "answer 1971"), ())


@_register("two_agent")
def _two_agent(s: Mapping[str, Any]) -> Instruction:
    side = 2 * s["view_radius"] + 1
    messages = tuple(f"say {m}" for m in _MOVES + ("stay",))
    moves = _MOVES + ("stay",)
    text = (
        "You play both roles of a cooperative game: a guide who sees the whole map and a "
        "walker who sees only nearby cells; together bring the walker to the goal. Turns "
        f"alternate, guide first. An observation starting with {_q('guide:')} shows the map, "
        f"one row per line ({_q('_')} floor, {_q('#')} wall, {_q('G')} goal, {_q('W')} "
        f"walker): reply with a message, {_quoted(messages)}. An observation starting with "
        f"{_q('walker:')} shows what the guide said and the {side}x{side} cells around the "
        f"walker, who is in the middle (the goal looks like floor there): reply with a move, "
        f"{_quoted(moves)}. Reply with the action only."
    )
    return Instruction(text, messages + moves, ("guide:", "walker:", "_", "#", "G", "W"))


@_register("web_shop")
def _web_shop(s: Mapping[str, Any]) -> Instruction:
    del s
    examples = ("search shirt", "click b02", "select m", "back", "buy")
    text = (
        "You shop in a small web store: buy the product that the first line asks for, with "
        "its category, color or material, size and price limit. Pages: the search page "
        f"{_q('[search]')}, a results page listing products by item id, and a product page "
        f"with its {_q('price:')}, its sizes and the {_q('selected:')} size. Each turn reply "
        "with one command: on the search page search KEYWORD, one category, color or "
        f"material, e.g. {_q('search shirt')}; click ITEM opens a listed product, its id "
        f"without brackets, e.g. {_q('click b02')}; on a product page select SIZE, e.g. "
        f"{_q('select m')}; {_q('back')} returns to the previous page; {_q('buy')} on a "
        "product page buys it with the selected size and ends the game. "
        "Reply with the command only."
    )
    return Instruction(text, examples, ("[search]", "price:", "selected:"))


@_register("terminal")
def _terminal(s: Mapping[str, Any]) -> Instruction:
    del s
    examples = ("ls", "cd docs", "cd ..", "cat notes.md", "grep key", "pwd", "submit 1024")
    text = (
        "You use a small shell to find the value of a field hidden in one file of a directory "
        "tree, then submit it; the first line names the field. Every output ends with the "
        f"prompt {_q('$')}. Each turn reply with one command: {_q('ls')} lists the current "
        "directory (directories end in /); cd DIR enters a subdirectory, e.g. "
        f"{_q('cd docs')}, and {_q('cd ..')} goes up; cat FILE prints a file whose lines "
        f"read field = value or field: value, e.g. {_q('cat notes.md')}; grep WORD lists the "
        f"lines below the current directory whose field or value is WORD, e.g. "
        f"{_q('grep key')}; {_q('pwd')} prints the current directory; submit VALUE ends the "
        f"game, e.g. {_q('submit 1024')}. Arguments are single names, never paths. "
        "Reply with the command only."
    )
    return Instruction(text, examples, ("$",))


@_register("household")
def _household(s: Mapping[str, Any]) -> Instruction:
    del s
    examples = (
        "go to cabinet 1",
        "open cabinet 1",
        "take mug 1 from cabinet 1",
        "clean mug 1 with sink",
        "put mug 1 in table 1",
    )
    text = (
        "You do a household task in a room with numbered receptacles (countertop, table, "
        "shelf, cabinets, drawers, fridge, microwave, sink) and numbered objects; the first "
        f"observation gives the task after {_q('your task is to :')}. Cabinets, drawers, the "
        "fridge and the microwave start closed, and you carry at most one object. Each turn "
        "reply with one command: go to R, open R, close R, take O from R, put O in R, "
        "clean O with sink, heat O with microwave, cool O with fridge, look or inventory, "
        "with R a receptacle and O an object as the observations name them, e.g. "
        f"{_quoted(examples)}; to clean, heat or cool an object go to the "
        "sink, microwave or fridge holding it. Reply with the command only."
    )
    return Instruction(text, examples, ("your task is to :",))
