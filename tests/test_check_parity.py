"""scripts/check_parity.py on a tiny random Llama: the report, the files, and the exit status
when our logits or greedy tokens differ from transformers'."""

import json
import os

import numpy as np
import pytest

from rl4agents.models import parity
from tests.hf_fixtures import needs, write_tiny_llama
from tests.scripts import load_script

pytestmark = needs("torch", "transformers", "tokenizers", "safetensors")
CORPUS = ["The quick brown fox jumps over the lazy dog. def fibonacci(n): return n\n"] * 40


@pytest.fixture(scope="module")
def check_parity():
    return load_script("check_parity")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "model"
    write_tiny_llama(path, CORPUS, num_hidden_layers=2, rms_norm_eps=1e-5)
    return str(path)


def test_batch__left_padding_positions_and_mask():
    tokens, positions, mask, valid = parity.batch([[5, 6, 7], [8]], pad_id=0, left=True)
    np.testing.assert_array_equal(tokens, [[5, 6, 7], [0, 0, 8]])
    np.testing.assert_array_equal(positions, [[0, 1, 2], [0, 0, 0]])
    np.testing.assert_array_equal(valid, [[1, 1, 1], [0, 0, 1]])
    # row 1: the pads see only themselves, the real token sees itself only
    np.testing.assert_array_equal(mask[1], [[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    tokens, positions, mask, valid = parity.batch([[5, 6, 7], [8]], pad_id=0, left=False)
    np.testing.assert_array_equal(tokens, [[5, 6, 7], [8, 0, 0]])
    np.testing.assert_array_equal(positions, [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(mask[1], np.tril(np.ones((3, 3))))


def test_main__writes_the_report_and_passes(check_parity, folder, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [f"--model={folder}", f"--out={out}", "--float64", "--layers", "--new_tokens=6"]
    assert check_parity.main(argv) == 0
    result = json.loads((out / "parity.json").read_text())
    assert result["model"] == "model" and result["architecture"] == "llama"
    assert result["prompts"] == list(parity.PROMPT_NAMES)
    assert all(n > 1 for n in result["prompt_tokens"])
    assert set(result["logits"]) == {k for k, _ in check_parity.COLUMNS}
    for key, values in result["logits"].items():
        assert len(values) == 4 and max(values) < 1e-4, (key, values)
    assert max(result["logits"]["ours_padded_vs_unpadded"]) < 1e-5
    assert result["greedy"]["equal"] and len(result["greedy"]["ours"]) == 6
    assert result["passed"] and result["host"]["logical_cpus"] >= 1
    hidden = result["hidden_states"]
    assert hidden["prompt"] in parity.PROMPT_NAMES and len(hidden["states"]) == 3  # embed + 2
    assert hidden["states"][0]["ours"] == 0.0
    assert all(row["ours"] < 1e-4 and row["max_abs"] > 0 for row in hidden["states"])
    table = (out / "parity.md").read_text()
    # header + separator + 4 prompts, then header + separator + 3 hidden states
    assert table.count("\n| ") == 10 and "passed" in table
    assert table in capsys.readouterr().out
    assert (out / "command.txt").read_text() == f"python scripts/check_parity.py {' '.join(argv)}\n"


def test_main__fails_when_logits_or_greedy_tokens_differ(check_parity, folder, monkeypatch):
    real = parity.our_logits
    monkeypatch.setattr(parity, "our_logits", lambda *a: real(*a) + 1e-2)
    assert check_parity.main([f"--model={folder}", "--new_tokens=2"]) == 1
    monkeypatch.setattr(parity, "our_logits", real)
    monkeypatch.setattr(parity, "reference_greedy", lambda ref, ids, n: [0] * n)
    assert check_parity.main([f"--model={folder}", "--new_tokens=2"]) == 1


def test_main__random_prompts_without_a_tokenizer_and_bad_flags(check_parity, folder, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((open(os.path.join(folder, name), "rb")).read())
    assert check_parity.main([f"--model={bare}", "--new_tokens=2"]) == 0
    assert check_parity.main([f"--model={tmp_path}"]) == 2
    assert check_parity.main([f"--model={folder}", "--new_tokens=0"]) == 2
    assert check_parity.main([f"--model={folder}", "--atol=0"]) == 2
    assert check_parity.main([f"--model={folder}", "--layers"]) == 2


def test_layer_errors__a_wrong_block_shows_as_a_jump_at_that_block(folder):
    import torch
    import transformers

    from rl4agents.models import hf

    policy, _ = hf.load_pretrained(folder, "float32")
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = list(range(3, 20))
    clean = parity.layer_errors(policy, ref, ids)
    assert max(row["ours"] for row in clean) < 1e-4
    down = policy.model.layers[1].mlp.down_proj
    down.kernel[...] = down.kernel[...] * 1.01  # a 1% error in block 2's MLP
    broken = parity.layer_errors(policy, ref, ids)
    assert broken[1]["ours"] < 1e-4 < broken[2]["ours"]
