"""scripts/zero_shot.py: a tiny random Hugging Face checkpoint (chat template, byte-level BPE)
evaluated on two environments; the CSV rows equal a direct call of `loop.evaluate` on the same
parameters, and a second invocation skips what the CSV holds."""

from __future__ import annotations

import csv
import json
import pathlib

import pytest

from tests.hf_fixtures import needs, write_chatml_tokenizer, write_tiny_llama
from tests.scripts import load_script

pytestmark = needs("torch", "transformers", "tokenizers", "safetensors", "jinja2")

ENVS = ("frozen_lake", "countdown")
NUM_TASKS, CAP, ACTION = 2, 2, 4


@pytest.fixture(scope="module")
def zero_shot():
    return load_script("zero_shot")


# Mostly moves: " up", " down", " left" and " right" become single tokens.
CORPUS = ["go up down left right\n"] * 50 + ["invalid action\n", "calc 3 + 4 = 7 answer\n"] * 20


def _tokenizer(folder: pathlib.Path):
    """A ChatML byte-level BPE of 300 tokens written to `folder` (tokenizer files only)."""
    return write_chatml_tokenizer(folder, CORPUS)


def _checkpoint(folder: pathlib.Path) -> str:
    """A random 1-layer Llama with a ChatML byte-level BPE of 300 tokens (vocab_size 320)."""
    import torch

    tok, model = write_tiny_llama(folder, CORPUS)
    with torch.no_grad():
        # A policy that mostly writes moves, so that frozen_lake's numbers are not all 0 or 1:
        # every embedding gets a first component of 1, far above the others (~0.02), which the
        # final norm keeps (~5.6); the head reads it as a bias of ~5.6 towards the four moves
        # and the end of turn. Replies like " left up<|im_end|>" then end in a valid move.
        model.model.embed_tokens.weight[:, 0] = 1.0
        moves = ("\u0120up", "\u0120down", "\u0120left", "\u0120right", "<|im_end|>")
        model.lm_head.weight[[tok.token_to_id(w) for w in moves], 0] = 1.0
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


def test_data_size__largest_device_count_that_splits_the_tasks(zero_shot):
    assert zero_shot.data_size(2, 8) == 2
    assert zero_shot.data_size(6, 4) == 2
    assert zero_shot.data_size(128, 1) == 1
    assert zero_shot.data_size(64, 8) == 8


def test_zero_shot__csv_rows_equal_a_direct_evaluation_and_resume_skips(
    zero_shot, tmp_path, capsys
):
    from rl4agents.envs import instructions
    from rl4agents.train import experiment, loop, resolve

    model = _checkpoint(tmp_path / "model")
    out = tmp_path / "out"
    argv = [
        f"--model={model}",
        f"--out={out}",
        f"--num_tasks={NUM_TASKS}",
        f"--envs={','.join(ENVS)}",
        f"--max_turns_cap={CAP}",
        f"--max_action_len={ACTION}",
    ]
    assert zero_shot.main(argv) == 0
    with open(out / "zero_shot.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == zero_shot.COLUMNS
        assert [row["env"] for row in reader] == list(ENVS)  # one row each, in ENVS order
    rows = {r["env"]: r for r in zero_shot.read_rows(out / "zero_shot.csv")}
    for env in ENVS:
        row = rows[env]
        assert row["num_tasks"] == NUM_TASKS and row["seconds"] > 0
        for col in ("greedy_success", "sampled_success"):
            assert row[col] in (0.0, 0.5, 1.0)  # the share of 2 tasks
        for col in ("greedy_invalid_rate", "sampled_invalid_rate"):
            assert 0.0 <= row[col] <= 1.0
        for col in ("greedy_avg_turns", "sampled_avg_turns"):
            assert 1.0 <= row[col] <= CAP
        config = zero_shot.env_config(
            env, model, NUM_TASKS, max_action_len=ACTION, max_turns_cap=CAP
        )
        # configs/frozen_lake.py: 8 turns, 1 action token; countdown: 6 turns, 7 tokens. The
        # budget is the largest of the flag, the config's and the longest action's.
        longest = resolve.make_env(config).max_action_len
        assert config.rollout.max_turns == CAP
        want = max(ACTION, longest, {"frozen_lake": 1, "countdown": 7}[env])
        assert config.rollout.max_action_len == want
        assert config.env.vocab == "builtin" and config.model.checkpoint == model
        # The default system prompt is the environment's instruction under its settings.
        settings = config.env[env].to_dict()
        assert config.model.system_prompt == instructions.get(env, settings).text
        exp = experiment.build(config)
        direct = loop.evaluate(exp, exp.pretrained_params(), "test", NUM_TASKS)
        for col, key in zero_shot.METRICS.items():
            assert row[col] == direct[key], (env, col)  # the CSV holds repr(float): exact
    # Not all-or-nothing: the comparison above checks numbers that depend on the episodes.
    assert 0.0 < rows["frozen_lake"]["sampled_invalid_rate"] < 1.0
    table = (out / "zero_shot.md").read_text().splitlines()
    assert len(table) == 2 + len(ENVS) and table[0].startswith("| env ")
    assert "zero_shot.py" in (out / "command.txt").read_text()

    capsys.readouterr()
    assert zero_shot.main(argv) == 0  # resumed: everything is in the CSV already
    printed = capsys.readouterr().out
    assert printed.count("skipped, in zero_shot.csv") == len(ENVS)
    assert len((out / "command.txt").read_text().splitlines()) == 2


def test_zero_shot__refuses_bad_flags(zero_shot, tmp_path, capsys):
    model = tmp_path / "empty"
    model.mkdir()
    assert zero_shot.main([f"--model={model}", f"--out={tmp_path / 'o'}"]) == 2
    assert "holds no config.json" in capsys.readouterr().err
    (model / "config.json").write_text("{}")
    assert zero_shot.main([f"--model={model}", f"--out={tmp_path}", "--envs=chess"]) == 2
    assert "--envs names ['chess']" in capsys.readouterr().err
    assert zero_shot.main([f"--model={model}", f"--out={tmp_path}", "--num_tasks=0"]) == 2
    with pytest.raises(ValueError, match=r"--max_turns_cap=-1; allowed"):
        zero_shot.env_config("maze", str(model), 2, max_turns_cap=-1)


def test_env_config__system_prompt_auto_is_the_instruction_explicit_wins_empty_none(
    zero_shot, tmp_path
):
    from rl4agents.envs import instructions

    folder = tmp_path / "tok"
    _tokenizer(folder)
    assert zero_shot.parse_args(["--model=m", "--out=o"]).system_prompt == "auto"
    assert zero_shot.parse_args(["--model=m", "--out=o", "--system_prompt="]).system_prompt == ""
    # configs/frozen_lake.py: a compact 4x4 grid, so the instruction says 16 cells in a row.
    auto = zero_shot.env_config("frozen_lake", str(folder), 2)
    want = instructions.get("frozen_lake", {"compact": True, "size": 4}).text
    assert auto.model.system_prompt == want
    assert "its 16 cells written row by row with no line breaks" in want
    assert zero_shot.env_config("frozen_lake", str(folder), 2, system_prompt="auto") == auto
    own = zero_shot.env_config("frozen_lake", str(folder), 2, system_prompt="Play well.")
    assert own.model.system_prompt == "Play well."
    assert (
        zero_shot.env_config("frozen_lake", str(folder), 2, system_prompt="").model.system_prompt
        == ""
    )


SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}


def test_real_model_config__lora_instruction_chat_and_refused_critics(tmp_path):
    """configs/real_model.py: any environment's config with a checkpoint as the policy, LoRA,
    the environment's instruction as system message; its runs pass the start-up checks."""
    from rl4agents import config_utils, memory
    from rl4agents.envs import instructions
    from rl4agents.models import chat
    from rl4agents.train import experiment, resolve

    root = pathlib.Path(__file__).resolve().parents[1]
    c = config_utils.load_config_file(f"{root}/configs/real_model.py:guess_number")
    assert c.env.name == "guess_number" and c.model.checkpoint.endswith("smollm2-135m-instruct")
    assert (c.model.lora.rank, c.model.system_prompt, c.credit.name) == (16, "auto", "grpo")
    assert c.rollout.max_action_len == 16 and c.env.vocab == "builtin"
    c.unlock()
    c.model.checkpoint = _checkpoint(tmp_path / "m")
    c.lock()
    experiment.build(c, check_only=True)
    env = resolve.make_env(c)
    want = instructions.get("guess_number", config_utils.to_dict(c.env.guess_number)).text
    assert isinstance(env.tokenizer.chat, chat.ChatFormat)
    assert env.tokenizer.chat.system_prompt == want
    # SmolLM2-135M's dimensions (its config.json, a tiny tokenizer): the run fits the 2 x 11.77
    # GiB of this project's CPU machine only with rematerialised layers.
    smol = tmp_path / "smol"
    write_chatml_tokenizer(smol, CORPUS)
    (smol / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    c.unlock()
    c.model.checkpoint = str(smol)
    c.lock()
    budget = int(11.77 * 2**30)
    memory.check_fits(resolve.resolve(c, check_only=True), 2, budget)
    c.unlock()
    c.model.remat = False
    c.lock()
    with pytest.raises(ValueError, match="does not fit"):
        memory.check_fits(resolve.resolve(c, check_only=True), 2, budget)
    rloo = config_utils.load_config_file(f"{root}/configs/real_model.py:frozen_lake,rloo")
    assert rloo.env.name == "frozen_lake" and rloo.credit.name == "rloo"
    with pytest.raises(ValueError, match="credit variant 'ppo_gae' needs a value head"):
        config_utils.load_config_file(f"{root}/configs/real_model.py:guess_number,ppo_gae")
