"""scripts/bf16_tolerance.py on a tiny random Llama: the report and its files, zero for two f32
runs, small positive differences for bf16, and bad flags refused."""

import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from rl4agents.models import hf, parity
from tests.hf_fixtures import needs, write_tiny_llama
from tests.scripts import load_script

pytestmark = needs("torch", "transformers", "tokenizers", "safetensors")
CORPUS = ["The quick brown fox jumps over the lazy dog. def fibonacci(n): return n\n"] * 40


@pytest.fixture(scope="module")
def bf16_tolerance():
    return load_script("bf16_tolerance")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "model"
    write_tiny_llama(path, CORPUS, num_hidden_layers=2, rms_norm_eps=1e-5)
    return str(path)


def test_tolerance__zero_for_the_same_dtype_twice(bf16_tolerance, folder):
    names, seqs, pad_id = bf16_tolerance.prompts(folder, 320)
    assert names == list(parity.PROMPT_NAMES)
    first, _ = hf.load_pretrained(folder, "float32")
    again, _ = hf.load_pretrained(folder, "float32")
    logits = bf16_tolerance.our_logits(first, seqs, pad_id)
    assert [x.shape for x in logits] == [(len(s), 320) for s in seqs]
    found = bf16_tolerance.tolerance(logits, bf16_tolerance.our_logits(again, seqs, pad_id), seqs)
    for row in found["prompts"] + [found["all"]]:
        assert row["same_argmax"] == 1.0 and row["max_logit"] > 0
        assert row["max_dlogp"] == row["mean_dlogp"] == row["max_dentropy"] == 0
        assert row["max_dlogit"] == 0
    assert found["all"]["tokens"] == sum(len(s) for s in seqs)


def test_load__bf16_compute_keeps_the_float32_weights(folder):
    f32, _ = hf.load_pretrained(folder, "float32")
    bf16, cfg = hf.load_pretrained(folder, "bfloat16", param_dtype="float32")
    assert (cfg.dtype, cfg.param_dtype) == ("bfloat16", "float32")
    a, b = jax.tree.leaves(nnx.state(f32)), jax.tree.leaves(nnx.state(bf16))
    assert all(x.dtype == y.dtype == jnp.float32 and bool((x == y).all()) for x, y in zip(a, b))


def test_main__writes_the_report(bf16_tolerance, folder, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [f"--model={folder}", "--torch", f"--out={out}"]
    assert bf16_tolerance.main(argv) == 0
    result = json.loads((out / "tolerance.json").read_text())
    assert result["model"] == "model" and result["architecture"] == "llama"
    assert result["ours_bf16"] == dict(dtype="bfloat16", param_dtype="float32")
    assert result["prompts"] == list(parity.PROMPT_NAMES)
    assert set(result["tolerance"]) == {"ours", "torch"} and "torch" in result["versions"]
    for run in result["tolerance"].values():
        assert len(run["prompts"]) == 4
        assert run["all"]["tokens"] == sum(result["prompt_tokens"])
        # bf16 really computed, and close: a random 2-layer model's logits are small
        assert 0 < run["all"]["mean_dlogp"] <= run["all"]["max_dlogp"] < 0.05
        assert 0 < run["all"]["max_dlogit"] < 0.05 and 0 < run["all"]["max_dentropy"] < 0.05
        assert 0.5 < run["all"]["same_argmax"] <= 1
    table = (out / "tolerance.md").read_text()
    assert table.count("\n| ") == 1 + 2 * 5  # separator, 4 prompts + all per run
    assert table in capsys.readouterr().out
    command = f"python scripts/bf16_tolerance.py {' '.join(argv)}\n"
    assert (out / "command.txt").read_text() == command
    assert bf16_tolerance.main(argv[:1]) == 0  # ours only, appends nothing
    assert (out / "command.txt").read_text() == command


def test_main__bad_flags_exit_2(bf16_tolerance, folder, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv in (
        [f"--model={tmp_path}"],  # no config.json
        [],  # --model missing
        [f"--model={folder}", "--bogus"],
        [f"--model={folder}", f"--out={afile}"],
    ):
        with pytest.raises(SystemExit) as e:
            bf16_tolerance.main(argv)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
