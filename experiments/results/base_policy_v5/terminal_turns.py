"""Count what base v5 does in terminal, turn by turn, from `scripts/show_episodes.py`'s text.

  python scripts/show_episodes.py --config=configs/base_policy.py:terminal \
      --params=runs/base_policy_v5 --num=64 --greedy \
      --out=experiments/results/base_policy_v5/terminal_greedy_64.txt
  python experiments/results/base_policy_v5/terminal_turns.py \
      experiments/results/base_policy_v5/terminal_greedy_64.txt

Prints the commands by kind and validity, and for every `submit`: whether its value is in the
environment's value pool (a value outside it is an invalid command), and whether it is the
value the episode's own observations printed on the key line (the right answer, once seen).
"""

import collections
import re
import sys

from rl4agents.envs.terminal import world


def unspace(text: str) -> str:
    """The environment's tokenizer spells names and digits letter by letter: 'c o d e' -> 'code'."""
    return re.sub(r"(?<=\b\w) (?=\w\b)", "", text)


def episodes(path: str):
    """Yield (task field, [(action, valid, cut)], [observation lines]) per episode."""
    text = open(path).read()
    for block in text.split("=== episode")[1:]:
        field = unspace(re.search(r"f i n d the v a l u e of (.*?) and", block).group(1))
        turns, seen = [], []
        for m in re.finditer(
            r"^turn \d+: action '(.*?)'( \(no end-of-action[^)]*\))? (valid|INVALID).*?\n"
            r"  observation:\n((?:    .*\n)*)",
            block,
            re.M,
        ):
            turns.append((unspace(m.group(1)), m.group(3) == "valid", bool(m.group(2))))
            seen.append(unspace(m.group(4)))
        yield field, turns, seen


def main(path: str) -> None:
    kinds = collections.Counter()
    submits = collections.Counter()
    found_value, n_episodes, first_grep_right = 0, 0, 0
    pool = set(world.VALUES)
    for field, turns, seen in episodes(path):
        n_episodes += 1
        first_grep_right += turns[0][0] == f"grep {field}"
        key_value = None
        for (action, valid, cut), obs in zip(turns, seen):
            word = action.split(" ")[0] or "(empty)"
            kinds[(word, "valid" if valid else "invalid", "cut at budget" if cut else "")] += 1
            if word == "submit":
                value = action[len("submit ") :]
                submits[
                    (
                        "in pool" if value in pool else "not in pool",
                        "key value seen" if key_value is not None else "key value not yet seen",
                        "equals it" if value == key_value else "differs",
                    )
                ] += 1
            m = re.search(rf"\b{field} ?[=:] ?(\w+)", obs)
            if m and key_value is None:
                key_value = m.group(1)
        found_value += key_value is not None
    print(f"{n_episodes} episodes; first command greps the task's field in {first_grep_right}")
    print(f"episodes whose observations printed the key value: {found_value}")
    print("\ncommands (kind, validity, cut):")
    for k, n in kinds.most_common():
        print(f"  {n:4d}  {' '.join(x for x in k if x)}")
    print("\nsubmits (value in the pool?, key value printed before?, submitted = printed?):")
    for k, n in submits.most_common():
        print(f"  {n:4d}  {', '.join(k)}")


if __name__ == "__main__":
    main(sys.argv[1])
