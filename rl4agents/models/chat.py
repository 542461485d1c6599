"""Multi-turn episodes as a chat: observations are user messages, actions assistant messages.

A real instruct model reads its conversations through its own chat template. `ChatFormat`
reads the template's turn structure once, by rendering a conversation whose messages are
sentinel strings and cutting the text at them:

    head + obs_0 + user_to_assistant + act_0 + assistant_end + obs_1 + user_to_assistant + ...

  head               everything before the first user message's content (BOS if the template
                     writes one, the system turn, the user header);
  user_to_assistant  after a user message's content: its end and the assistant header (the
                     generation prompt);
  assistant_end      after an assistant message's content: the end-of-turn token, then
                     whatever precedes the next user message's content.

The first token of `assistant_end` is the end-of-turn token (`eot_id`): generation stops there.
A rollout then lays the episode out as

    prompt  = encode(head + obs_0 + user_to_assistant)        (its first token in slot 0)
    turn k  = sampled action tokens, eot_id                   (A action slots)
              encode(rest + obs_k+1 + user_to_assistant)      (O observation slots)

with `rest` = `assistant_end` after the end-of-turn token. Every cut but one lies at a special
token, where a Hugging Face tokenizer splits before it runs the model, so these pieces
concatenated are the ids of the whole conversation rendered by `apply_chat_template` (with the
generation prompt after the last user message): no text is ever decoded and re-encoded. The
one cut inside ordinary text is between the assistant header and the action; byte-level BPE
pre-tokenizers split there when the header ends in a newline and the action starts with a
letter, a digit, punctuation or one space, which `tests/models/test_chat.py` checks against
`transformers`. An action is kept as the tokens that were sampled; when those are not the
tokenizer's own encoding of their text (a model can spell a word in pieces), the stream keeps
what was sampled, which is what its log-probs belong to.

`parse_action` reads an action the way a model writes one: case, spaces, punctuation, quotes
and a short preamble around exactly one known action are accepted, anything else is invalid.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from rl4agents.models import hf_tokenizer

# Sentinels: letters only (templates may `trim` contents), unlikely in any template.
_USER = "QXZUSERQXZ{}"
_ASSISTANT = "QXZASSISTANTQXZ{}"


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """The turn structure of a chat template (see the module docstring).

    Build it with `ChatFormat.from_tokenizer`.

    Attributes:
      head: text before the first user content (system turn included).
      user_to_assistant: text from the end of a user content to the start of an assistant
        content.
      assistant_end: text from the end of an assistant content to the next user content; it
        starts with the end-of-turn token.
      eot: the end-of-turn token's text; eot_id its id.
      system_prompt: the system message given, or None (the template's own default, if any).
      strips: the template strips whitespace around contents (Llama 3's `| trim`); the
        observations are then stripped before encoding, as the template would.
    """

    tokenizer: object
    system_prompt: str | None
    head: str
    user_to_assistant: str
    assistant_end: str
    eot: str
    eot_id: int
    strips: bool = False

    @classmethod
    def from_tokenizer(cls, tokenizer, system_prompt: str | None = None) -> ChatFormat:
        """Reads the turn structure of `tokenizer`'s chat template.

        Args:
          tokenizer: an `HFTokenizer` (anything with `apply_chat_template`, `encode` and
            `special_token_prefix`).
          system_prompt: a system message opening every conversation; None or "" for none
            (the template may still write its default one).

        Raises:
          ValueError: no chat template; a template whose turns are not all rendered the same
            way; an assistant turn not ended by a special token; or a conversation that does
            not start with one (the rollout's slot 0).
        """
        system_prompt = system_prompt or None
        users = [_USER.format(i) for i in range(3)]
        assistants = [_ASSISTANT.format(i) for i in range(2)]
        messages = _messages(users, assistants, system_prompt)
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        pieces = re.split("(" + "|".join(users + assistants) + ")", rendered)
        name = getattr(tokenizer, "folder", type(tokenizer).__name__)
        if pieces[1::2] != [users[0], assistants[0], users[1], assistants[1], users[2]]:
            raise ValueError(
                f"the chat template of {name} does not render each message's content once, "
                "in order; allowed: templates that write user and assistant contents verbatim"
            )
        head, u2a, a_end = pieces[0], pieces[2], pieces[4]
        if pieces[6] != u2a or pieces[10] != u2a or pieces[8] != a_end:
            raise ValueError(
                f"the chat template of {name} renders later turns differently from the first "
                f"({pieces[2:11:2]!r}); allowed: templates whose turns repeat one pattern"
            )
        eot = tokenizer.special_token_prefix(a_end)
        if eot is None:
            raise ValueError(
                f"the chat template of {name} ends an assistant turn with {a_end!r}, which "
                "does not start with a special token; allowed: templates whose assistant "
                "turns end in one (the end-of-turn token generation stops at)"
            )
        if tokenizer.special_token_prefix(head) is None:
            raise ValueError(
                f"the chat template of {name} starts a conversation with {head[:40]!r}, not "
                "with a special token; allowed: templates that open with one (BOS or a turn "
                "header), the rollout's first slot"
            )
        padded = [{"role": "user", "content": " " + users[0] + "\n"}]
        strips = " " + users[0] + "\n" not in tokenizer.apply_chat_template(padded)
        eot_id = tokenizer.token_id(eot)
        return cls(tokenizer, system_prompt, head, u2a, a_end, eot, eot_id, strips)

    @property
    def after_eot(self) -> str:
        """`assistant_end` after its end-of-turn token."""
        return self.assistant_end[len(self.eot) :]

    def prompt_ids(self, obs: str) -> list[int]:
        """Ids of the conversation up to the first action: head, `obs`, generation prompt."""
        obs = obs.strip() if self.strips else obs
        return self.tokenizer.encode(self.head + obs + self.user_to_assistant)

    def turn_ids(self, obs: str) -> list[int]:
        """Ids after an action's end-of-turn token: the next user message `obs` and the
        generation prompt."""
        obs = obs.strip() if self.strips else obs
        return self.tokenizer.encode(self.after_eot + obs + self.user_to_assistant)

    def framing(self) -> ChatFraming:
        """The fixed token pieces around observations, for a jitted environment
        (`rl4agents.envs.base.ChatEnv`)."""
        head = self.tokenizer.encode(self.head)
        return ChatFraming(
            bos_id=int(head[0]),
            prompt_prefix=np.asarray(head[1:], np.int32),
            obs_prefix=np.asarray(self.tokenizer.encode(self.after_eot), np.int32),
            obs_suffix=np.asarray(self.tokenizer.encode(self.user_to_assistant), np.int32),
            eot_id=self.eot_id,
        )

    def messages(self, observations: Sequence[str], actions: Sequence[str]) -> list[dict]:
        """The conversation as chat messages: the system prompt (if any), then observation k
        as a user message and action k as an assistant message, alternating.

        Args:
          observations: texts; one more than `actions`, or as many.
          actions: texts.
        """
        return _messages(observations, actions, self.system_prompt)

    def episode_ids(
        self, observations: Sequence[str], actions: Sequence[Sequence[int]]
    ) -> list[int]:
        """The token stream of an episode as a rollout writes it (see the module docstring).

        Args:
          observations: the reset text then each turn's observation (one more than actions).
          actions: each turn's action ids, end-of-turn excluded.

        Returns:
          list[int]: prompt ids, then per turn the action ids, `eot_id` and the next
          observation's ids.
        """
        if len(observations) != len(actions) + 1:
            raise ValueError(
                f"{len(observations)} observations for {len(actions)} actions; expected one "
                "more observation than actions"
            )
        ids = self.prompt_ids(observations[0])
        for act, obs in zip(actions, observations[1:]):
            ids += [int(t) for t in act] + [self.eot_id] + self.turn_ids(obs)
        return ids


@dataclasses.dataclass(frozen=True)
class ChatFraming:
    """Token pieces a chat adds around an environment's observations (int32 arrays).

    prompt = [bos_id] + prompt_prefix + reset observation + obs_suffix; after each action's
    `eot_id`, obs_prefix + observation + obs_suffix.
    """

    bos_id: int
    prompt_prefix: np.ndarray  # int32[p]
    obs_prefix: np.ndarray  # int32[q]
    obs_suffix: np.ndarray  # int32[s]
    eot_id: int


def _messages(users, assistants, system_prompt):
    out = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for k, user in enumerate(users):
        out.append({"role": "user", "content": user})
        if k < len(assistants):
            out.append({"role": "assistant", "content": assistants[k]})
    return out


_EDGE = " \t\r\n\"'`*_.,;:!?()[]{}<>"


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def parse_action(text: str, actions: Sequence[str], max_extra_words: int = 8) -> int:
    """The action a model's reply names, or -1 (an invalid turn; never raises).

    Accepted: the action itself in any case, with spaces, quotes, brackets and punctuation
    around it ("Left", " LEFT.", "**left**", "[left]"), or one short preamble or remark naming
    exactly one action as whole words ("I'll go left.", "Action: LEFT", "move up now").
    Rejected (-1): no action, two different actions ("left or right"), an action only inside a
    longer word ("leftover"), or more than `max_extra_words` words besides the action.
    When one action's words contain another's ("search x" and "x"), the longer match counts.

    Args:
      text: the decoded reply (end-of-turn token excluded).
      actions: the action texts, index = action id.
      max_extra_words: words allowed besides the action's own.

    Returns:
      int, the index into `actions`, or -1.
    """
    reply = _norm(text)
    names = [_norm(a) for a in actions]
    stripped = reply.strip(_EDGE)
    if stripped in names:
        return names.index(stripped)
    hits = []  # (start, end, action id)
    for i, name in enumerate(names):
        if not name:
            continue
        pattern = r"(?<![0-9a-z])" + re.escape(name) + r"(?![0-9a-z])"
        hits += [(m.start(), m.end(), i) for m in re.finditer(pattern, reply)]
    hits = [
        h
        for h in hits
        if not any(o[0] <= h[0] and h[1] <= o[1] and o[1] - o[0] > h[1] - h[0] for o in hits)
    ]
    found = {i for _, _, i in hits}
    if len(found) != 1:
        return -1
    action = found.pop()
    extra = len(reply.split()) - len(names[action].split())
    return action if extra <= max_extra_words else -1


class ChatTokenizer(hf_tokenizer.HFTokenizer):
    """The checkpoint's tokenizer laying episodes out as a chat: the same vocabulary, files and
    chat template, with the chat's first token as `bos_id`, its end-of-turn token as `eoa_id`,
    and the `ChatFormat` as `chat`.

    Host rollouts (`rl4agents.rollout.host`) frame observations with `chat` when the run's
    tokenizer has one; jitted environments are framed by `rl4agents.envs.base.ChatEnv`.
    Fragment tables built with it read actions leniently (`rl4agents.text.match_action`).
    """

    lenient_actions = True

    def __init__(self, fmt: ChatFormat):  # no files read again: a copy of fmt.tokenizer
        self.__dict__.update(fmt.tokenizer.__dict__)
        self.chat = fmt
        self.bos_id = fmt.framing().bos_id
        self.eoa_id = fmt.eot_id
