"""scripts/benchlib/real_model.py (`scripts/bench.py --real-model`): the jobs' inputs by hand,
and on a tiny random Llama folder (tied embeddings like SmolLM2, ChatML byte-level BPE) our
log-probs, losses and updates against PyTorch's on the same weights, and a run of the jobs."""

from __future__ import annotations

import copy
import json
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.join(_REPO, "scripts"))  # `benchlib` lives beside the scripts
from benchlib import real_model  # noqa: E402

from tests.hf_fixtures import needs, write_tiny_llama  # noqa: E402
from tests.scripts import load_script  # noqa: E402

pytestmark = needs("torch", "transformers", "tokenizers", "safetensors", "jinja2")

SIZES = real_model.Sizes(prompts=2, prompt_len=24, new_tokens=4, group=4)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A random 2-layer Llama (d=32, vocab 320, tied embeddings) with a 300-token ChatML BPE."""
    path = tmp_path_factory.mktemp("tiny_llama")
    write_tiny_llama(
        path,
        [real_model.QUESTIONS[0], real_model.ANSWER] * 50,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.1,  # spread-out logits: log-probs far from uniform
        tie_word_embeddings=True,
    )
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(folder):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(folder)


def test_data_size__largest_divisor_within_devices():
    assert real_model.data_size(8, 2) == 2
    assert real_model.data_size(6, 8) == 6
    assert real_model.data_size(2, 8) == 2
    assert real_model.data_size(7, 2) == 1


def test_chat_prompts__template_left_padded(tokenizer):
    prompts = real_model.chat_prompts(tokenizer, 3, 24)
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    tail = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert prompts.tokens.shape == (3, 24) and prompts.pad_id == tokenizer.pad_token_id
    for i, (row, mask) in enumerate(zip(prompts.tokens, prompts.mask)):
        n = int(mask.sum())
        assert n > len(tail) + 2 and not mask[: 24 - n].any()  # padding on the left only
        assert (row[: 24 - n] == prompts.pad_id).all() and row[24 - n] == start
        assert list(row[24 - len(tail) :]) == tail  # ends with the generation prompt
        # the longest word prefix of question i + FILLER whose chat fits 24 tokens
        words = f"{real_model.QUESTIONS[i]} {real_model.FILLER}".split()
        content = tokenizer.decode(row[mask]).split("user\n")[1].split("<|im_end|>")[0]
        k = len(content.split())
        assert k >= 1 and content == " ".join(words[:k])
        longer = [{"role": "user", "content": " ".join(words[: k + 1])}]
        chat = tokenizer.apply_chat_template(longer, add_generation_prompt=True, tokenize=False)
        assert len(tokenizer(chat, add_special_tokens=False)["input_ids"]) > 24


def test_chat_prompts__plain_text_when_the_template_does_not_fit(tokenizer):
    # The template alone needs more than 4 tokens: BOS + the text's first 4 - 1 - i % 3 tokens.
    prompts = real_model.chat_prompts(tokenizer, 3, 4)
    words = tokenizer(f"{real_model.QUESTIONS[1]} {real_model.FILLER}", add_special_tokens=False)[
        "input_ids"
    ]
    assert prompts.mask.sum(axis=1).tolist() == [4, 3, 2]
    assert prompts.tokens[1].tolist() == [prompts.pad_id, tokenizer.bos_token_id, *words[:2]]


def test_grpo_batch__layout_and_group_advantages(tokenizer):
    prompts = real_model.chat_prompts(tokenizer, 2, 24)
    batch = real_model.grpo_batch(tokenizer, prompts, group=4, new_tokens=3)
    answer = tokenizer(real_model.ANSWER, add_special_tokens=False)["input_ids"]
    assert batch.tokens.shape == (4, 27)
    # completion lengths T - g mod 3; rows take prompts 0, 1, 0, 1
    assert np.asarray(batch.action_mask).sum(axis=1).tolist() == [3, 2, 1, 3]
    np.testing.assert_array_equal(batch.tokens[2, :24], prompts.tokens[0])
    assert batch.tokens[1, 24:].tolist() == [*answer[1:3], prompts.pad_id]
    assert not bool(batch.valid[1, 26]) and bool(batch.valid[1, 25])
    # rewards 0, 1/2, 1, 0: mean 0.375, unbiased std sqrt(0.6875 / 3) = 0.478714
    std = math.sqrt(0.6875 / 3) + 1e-4
    want = [-0.375 / std, 0.125 / std, 0.625 / std, -0.375 / std]
    np.testing.assert_allclose(batch.advantages, want, rtol=1e-6)
    logp = -jnp.ones((4, 3))
    old = real_model.with_old_logp(batch, logp).logp_old
    shift = np.where(batch.action_mask, np.asarray(logp - old), 0.0)
    assert np.abs(shift).max() <= real_model.OLD_LOGP_SHIFT and np.abs(shift).max() > 0.1
    assert (np.asarray(old)[~np.asarray(batch.action_mask)] == 0).all()


def _loss_case():
    """One row, ratios 1.5, 0.5 and one masked slot; clip 0.2."""
    logp = jnp.log(jnp.asarray([[1.5, 0.5, 7.0]]))
    mask = jnp.asarray([[True, True, False]])
    return real_model.Batch(
        tokens=jnp.zeros((1, 4), jnp.int32),
        valid=jnp.ones((1, 4), bool),
        action_mask=mask,
        advantages=jnp.ones((1,)),
        logp_old=jnp.zeros((1, 3)),
    ), logp


@pytest.mark.parametrize("adv, want", [(1.0, -0.85), (-1.0, 1.15)])
def test_grpo_loss__hand_values_both_libraries(adv, want):
    # A = 1: max(-1.5, -1.2) = -1.2 and max(-0.5, -0.8) = -0.5, mean -0.85.
    # A = -1: max(1.5, 1.2) = 1.5 and max(0.5, 0.8) = 0.8, mean 1.15.
    import torch

    batch, logp = _loss_case()
    batch = batch._replace(advantages=jnp.asarray([adv]))
    ours = float(real_model.grpo_loss(logp, batch))
    theirs = float(
        real_model.torch_grpo_loss(torch.from_numpy(np.array(logp)), real_model.torch_batch(batch))
    )
    assert ours == pytest.approx(want, abs=1e-6) and theirs == pytest.approx(want, abs=1e-6)


@pytest.fixture(scope="module")
def setup(folder):
    return real_model.setup(folder, SIZES)


def test_setup__our_logp_equal_torch_f32(setup):
    assert setup.parity["float32"] < 1e-4
    # bf16: each side rounds to bf16 at different points (ours: the residual stream and every
    # product's operands; autocast: the operands of matmuls only), ~1e-2 apart here
    assert setup.parity["bfloat16"] < 5e-2
    assert setup.mesh.shape["data"] == 2  # the batch is sharded over the devices


def test_generate__sampled_logp_equal_torch_teacher_forced(setup, folder, tokenizer):
    import torch

    gen = real_model.make_generate(setup.graphdefs["float32"], setup.prompts, 4, setup.mesh)
    tokens, logp = gen(jax.random.key(3), setup.params)
    assert tokens.shape == (2, 4) and logp.shape == (2, 4)
    # The same prompts + sampled tokens scored by torch: our rollout sampled after the right
    # context (left padding, positions, first token) iff the log-probs agree.
    p = setup.prompts
    batch = real_model.Batch(
        tokens=jnp.concatenate([jnp.asarray(p.tokens), tokens], axis=1),
        valid=jnp.concatenate([jnp.asarray(p.mask), jnp.ones((2, 4), bool)], axis=1),
        action_mask=jnp.ones((2, 4), bool),
        advantages=jnp.zeros((2,)),
        logp_old=jnp.zeros((2, 4)),
    )
    with torch.no_grad():
        theirs = real_model.torch_completion_logp(setup.torch_model, real_model.torch_batch(batch))
    np.testing.assert_allclose(np.asarray(logp), theirs.numpy(), atol=1e-4)
    out = real_model.torch_generate(setup.torch_model, p, 4, "float32", seed=0)
    assert tuple(out.shape) == (2, 4) and int(out.max()) < 320


def test_grpo_step__two_steps_same_losses_as_torch(setup, monkeypatch):
    # A large learning rate, so that the second loss shows the first update (gradient, norm
    # clipping, AdamW) of each library: equal to 1e-4 in float32.
    import torch

    monkeypatch.setattr(real_model, "LR", 1e-2)
    step = real_model.make_grpo_step(setup.graphdefs["float32"], setup.mesh)
    params = jax.tree.map(jnp.copy, setup.params)
    opt_state = real_model.optimizer().init(params)
    model = copy.deepcopy(setup.torch_model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    ours, theirs = [], []
    for _ in range(2):
        params, opt_state, loss = step(params, opt_state, setup.batch)
        ours.append(float(loss))
        theirs.append(real_model.torch_grpo_step(model, opt, setup.torch_batch, "float32"))
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    assert abs(ours[1] - ours[0]) > 1e-3  # the update moved the loss
    # the first loss from the batch's own numbers: old log-probs are ours minus the shift
    logp = real_model.completion_logp(setup.graphdefs["float32"], setup.params, setup.batch)
    ratio = np.exp(np.asarray(logp - setup.batch.logp_old))
    adv = np.asarray(setup.batch.advantages)[:, None]
    per_tok = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2))
    mask = np.asarray(setup.batch.action_mask)
    assert ours[0] == pytest.approx(per_tok[mask].mean(), abs=1e-5)


def test_trl_grpo_step__trl_loss_is_the_formula_on_its_log_probs(setup, tokenizer, tmp_path):
    # TRL is optional (run the benchmark with a Python that has it). Its loss on our batch is
    # the clipped formula on its own log-probs (so the batch reaches it as laid out here), and
    # those come from its fused LM head in float32: the full log-softmax's up to rounding (with
    # TRL's default bf16 autocast left on they differ by a few 1e-3 here).
    pytest.importorskip("trl")
    import torch

    trainer = real_model.trl_trainer(
        copy.deepcopy(setup.torch_model), tokenizer, SIZES, str(tmp_path)
    )
    inputs = real_model.trl_inputs(setup.torch_batch, SIZES.prompt_len)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    valid = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, valid, SIZES.new_tokens
        )
        full = real_model.torch_completion_logp(setup.torch_model, setup.torch_batch)
    want = float(real_model.torch_grpo_loss(logp, setup.torch_batch))
    first = real_model.trl_grpo_step(trainer, inputs, "float32")
    assert first == pytest.approx(want, abs=1e-6) and first != 0.0
    assert real_model.trl_grpo_step(trainer, inputs, "float32") != first  # the update moved it
    mask = inputs["completion_mask"].bool()
    assert not trainer.args.bf16 and not trainer.args.fp16
    assert float((logp - full)[mask].abs().max()) < 1e-4


@pytest.fixture(scope="module")
def result(folder):
    return real_model.run(folder, SIZES, repeats=1, log=lambda msg: None, trl=False)


def test_run__rows_for_every_job_library_dtype(result):
    res = result
    cells = {(r["job"], r["library"], r["dtype"]) for r in res["rows"]}
    assert cells == {
        (j, lib, d)
        for j in real_model.JOBS
        for lib in real_model.LIBRARIES
        for d in real_model.DTYPES
    }
    for r in res["rows"]:
        assert all(math.isfinite(t) and t > 0 for t in [r["first_s"], *r["times_s"]])
        assert len(r["times_s"]) == 1
        if r["job"] == "generate":
            assert r["new_tokens"] == 8 and r["tokens_per_s"] > 0
        if r["library"] == "rl4agents":
            assert r["time_ratio"] > 0
    # before any update, float32: the same loss in both libraries
    first = res["first_loss"]
    assert first["rl4agents/float32"] == pytest.approx(first["torch/float32"], abs=1e-4)
    assert res["logp_parity"]["float32"] < 1e-4
    meta = res["meta"]
    assert meta["torch_threads"] >= 1 and meta["jax_devices"] and meta["cpu_model"]
    assert set(meta["cpu_flags"]) <= set(real_model.BF16_FLAGS)
    assert real_model.table(res).count("\n| ") == 1 + len(res["rows"])  # header + rows


def test_bench_cli__real_model_flag_checks_and_dispatch(folder, result, tmp_path, monkeypatch):
    bench = load_script("bench")
    with pytest.raises(SystemExit):  # no config.json there
        bench.main([f"--real-model={tmp_path}"])
    with pytest.raises(SystemExit):  # L = 0
        bench.main([f"--real-model={folder}", "--real-sizes=8,0,32,8"])
    with pytest.raises(SystemExit):  # not a dtype
        bench.main([f"--real-model={folder}", "--real-dtypes=float32,float16"])
    seen = {}

    def fake_run(path, sizes, repeats, dtypes, log):
        seen.update(path=path, sizes=sizes, repeats=repeats, dtypes=dtypes)
        return result

    monkeypatch.setattr(bench.real_model, "run", fake_run)
    out = tmp_path / "real.json"
    argv = [f"--real-model={folder}", "--real-sizes=2,24,4,4", "--repeats=1", f"--json={out}"]
    assert bench.main(argv) == 0
    assert seen == dict(path=folder, sizes=SIZES, repeats=1, dtypes=real_model.DTYPES)
    assert bench.main([*argv, "--real-dtypes=float32"]) == 0
    assert seen["dtypes"] == ("float32",)
    written = json.loads(out.read_text())
    assert written["real_model"]["rows"] == result["rows"] and "meta" in written


def test_profile_ops_real_update__the_benchmark_step_without_donation(folder):
    # The job `scripts/profile_ops.py real_update` profiles: called twice on the same inputs
    # (nothing donated), and its loss is the clipped formula at the ratios `with_old_logp`
    # sets (exp of its seed-0 shifts: the policy scores as it did when log p_old was made).
    profile_ops = load_script("profile_ops")
    fn, (params, opt_state, batch) = profile_ops.real_update_job(folder, "float32", SIZES)
    first = float(fn(params, opt_state, batch)[2])
    assert float(fn(params, opt_state, batch)[2]) == first
    mask = np.asarray(batch.action_mask, np.float64)
    adv = np.asarray(batch.advantages, np.float64)[:, None]
    shift = np.random.default_rng(0).uniform(
        -real_model.OLD_LOGP_SHIFT, real_model.OLD_LOGP_SHIFT, mask.shape
    )
    ratio = np.exp(shift)
    per_tok = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2))
    assert first == pytest.approx((per_tok * mask).sum() / mask.sum(), abs=1e-5)
