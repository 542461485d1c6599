"""scripts/compile_cost.py: the cost of compiling a run's train step, on a tiny checkpoint."""

import json
import os

import pytest

from tests.hf_fixtures import write_tiny_llama
from tests.scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def compile_cost():
    return load_script("compile_cost")


def test_truncated_checkpoint__keeps_the_first_layers(compile_cost, tmp_path):
    pytest.importorskip("transformers")
    from safetensors.numpy import load_file

    write_tiny_llama(tmp_path / "model", ["guess 12 higher lower correct\n"] * 50,
                     num_hidden_layers=3)  # fmt: skip
    out = compile_cost.truncated_checkpoint(str(tmp_path / "model"), 1, str(tmp_path / "one"))
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["num_hidden_layers"] == 1
    names = load_file(os.path.join(out, "model.safetensors")).keys()
    assert any(n.startswith("model.layers.0.") for n in names)
    assert not any(n.startswith(("model.layers.1.", "model.layers.2.")) for n in names)
    assert "model.embed_tokens.weight" in names
    assert os.path.exists(os.path.join(out, "tokenizer.json"))
    with pytest.raises(ValueError, match="--layers=4; allowed: 1 to 3"):
        compile_cost.truncated_checkpoint(str(tmp_path / "model"), 4, str(tmp_path / "four"))


def test_main__prints_the_cost_of_the_train_step(compile_cost, tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)
    write_tiny_llama(tmp_path / "model", ["guess 12 higher lower correct\n"] * 50,
                     num_hidden_layers=2)  # fmt: skip
    argv = [
        "--config=configs/real_model.py:guess_number",
        f"--set=model.checkpoint={tmp_path / 'model'}",
        "--set=rollout.num_tasks=4",
        "--set=train.eval_tasks=8",
        "--set=rollout.group_size=2",
        "--set=model.scan_layers=True",
        "--layers=1",
    ]
    assert compile_cost.main(argv) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["layers"] == 1
    assert record["compile_s"] > 0 and record["temp_gib"] > 0 and record["hlo_lines"] > 0
    assert compile_cost.main(["--config=configs/guess_number.py", "--set=seed"]) == 2


def test_table__markdown_of_the_json_lines(compile_cost, tmp_path, capsys):
    lines = tmp_path / "cost.jsonl"
    base = {"compile_s": 63.3, "temp_gib": 2.58, "hlo_lines": 185184, "peak_rss_gib": 2.91}
    records = [{**base, "layers": 30, "set": []}, {**base, "layers": 8, "set": ["a=1", "b=2"]}]
    lines.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert compile_cost.main([f"--table={lines}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| layers | set | compile_s | temp_gib | hlo_lines | peak_rss_gib |"
    assert out[2] == "| 30 | (config) | 63.3 | 2.58 | 185,184 | 2.91 |"
    assert out[3] == "| 8 | `a=1` `b=2` | 63.3 | 2.58 | 185,184 | 2.91 |"
    assert compile_cost.main([]) == 2
