"""LoRA adapters on the policy (`rl4agents.models.lora`): the zero-B start is the base model
exactly, the adapted forward equals the base model with merged kernels (and a numpy
reference), gradients and optimizer updates reach only the adapters, a few updates lower a
fixed batch's loss, and a merged export of a transformers Llama / Qwen2 reloads in
transformers with our adapted model's logits."""

import importlib.util
import os
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rl4agents import sharding
from rl4agents.models import hf, lora
from rl4agents.models import policy as policy_lib
from rl4agents.train import state as state_lib

B, S, V = 2, 10, 64
TARGET_SETS = (lora.ALL_TARGETS, ("q", "v", "down"), ("k", "o", "gate", "up"))


def _cfg(rank=4, targets=lora.ALL_TARGETS, **kw):
    base = dict(vocab_size=V, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2)
    base.update(head_dim=8, d_ff=48, attn_chunk=4, **kw)  # chunked attention in the forward
    return policy_lib.ModelConfig(**base, lora_rank=rank, lora_alpha=8.0, lora_targets=targets)


def _inputs(seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (B, S), 0, V)
    positions = jnp.broadcast_to(jnp.arange(S), (B, S))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((S, S), bool)), (B, S, S))
    return tokens, positions, mask


def _pure(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _with_base_of(cfg0, adapted):
    """A model of config `cfg0` (rank 0) holding `adapted`'s parameters merged (or as they
    are: the base weights of a zero-B adapter)."""
    base = policy_lib.Policy(cfg0, nnx.Rngs(1))
    merged = lora.merged_params(_pure(adapted), adapted.cfg)
    state = nnx.state(base, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, merged))
    nnx.update(base, state)
    return base


def _randomize_adapters(model, seed, size=0.3):
    """Sets every adapter's A and B to random non-zero values."""
    state = nnx.state(model, nnx.LoRAParam)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [size * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
    nnx.update(model, jax.tree.unflatten(treedef, new))


def _adapted_paths(model):
    paths = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.LoRAParam))[0]
    return sorted("/".join(str(getattr(k, "key", k)) for k in p[:-1]) for p, _ in paths)


@pytest.mark.parametrize("targets", TARGET_SETS)
def test_zero_b_is_the_base_model_exactly_and_merge_matches_the_adapted_forward(targets):
    cfg = _cfg(targets=targets, tie_embeddings=True, qkv_bias=True)
    model = policy_lib.Policy(cfg, nnx.Rngs(0))
    names = {lora.TARGETS[t][1] for t in targets}
    assert {p.split("/")[-2] for p in _adapted_paths(model)} == names
    assert len(_adapted_paths(model)) == 2 * len(targets) * cfg.num_layers
    a = nnx.state(model, nnx.LoRAParam)["model"]["layers"][0]
    for name in names:  # B starts at zero, A does not; both float32
        sub = a["attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"][name]
        assert not np.any(np.asarray(sub["lora_b"][...]))
        assert np.any(np.asarray(sub["lora_a"][...])) and sub["lora_a"][...].dtype == jnp.float32

    cfg0 = _cfg(rank=0, tie_embeddings=True, qkv_bias=True)
    base = _with_base_of(cfg0, model)
    tokens, positions, mask = _inputs()
    rows = jnp.array([[S - 1], [S - 3]])
    for kw in ({}, {"rows": rows}):
        np.testing.assert_array_equal(
            np.asarray(model(tokens, positions, mask, **kw).logits),
            np.asarray(base(tokens, positions, mask, **kw).logits),
        )

    _randomize_adapters(model, seed=3)
    merged = _with_base_of(cfg0, model)
    for kw in ({}, {"rows": rows}):
        got = np.asarray(model(tokens, positions, mask, **kw).logits)
        want = np.asarray(merged(tokens, positions, mask, **kw).logits)
        assert np.abs(got - np.asarray(base(tokens, positions, mask, **kw).logits)).max() > 1e-2
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_cached_decode_and_shared_prefix_see_the_adapters():
    cfg = _cfg()
    model = policy_lib.Policy(cfg, nnx.Rngs(0))
    _randomize_adapters(model, seed=4)
    tokens, positions, mask = _inputs()
    full = np.asarray(model(tokens, positions, mask).logits)
    cache = policy_lib.init_cache(cfg, B, S)
    out = model(tokens[:, :6], positions[:, :6], mask[:, :6], cache, 0)
    step = model(tokens[:, 6:7], positions[:, 6:7], mask[:, 6:7], out.cache, 6)
    np.testing.assert_allclose(np.asarray(step.logits[:, 0]), full[:, 6], atol=2e-5, rtol=0)
    same = tokens.at[1, :4].set(tokens[0, :4])  # rows 0, 1 share their first 4 tokens
    shared = np.asarray(model(same, positions, mask, prefix=4, group=2).logits)
    np.testing.assert_allclose(
        shared, np.asarray(model(same, positions, mask).logits), atol=2e-5, rtol=0
    )


def test_delta_matches_numpy():
    rank, alpha, d_in, d_out = 3, 6.0, 5, 7
    linear = nnx.Linear(d_in, d_out, rngs=nnx.Rngs(0))
    lora.attach(linear, rank, nnx.Rngs(1))
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(d_in, rank)), rng.normal(size=(rank, d_out))
    x = rng.normal(size=(2, 4, d_in)).astype(np.float32)
    linear.lora_a[...] = jnp.asarray(a, jnp.float32)
    linear.lora_b[...] = jnp.asarray(b, jnp.float32)
    want = np.zeros((2, 4, d_out))
    for i in range(2):  # the slow, obvious sum over every index
        for t in range(4):
            for o in range(d_out):
                want[i, t, o] = sum(
                    x[i, t, j] * a[j, k] * b[k, o] for j in range(d_in) for k in range(rank)
                )
    got = lora.delta(linear, jnp.asarray(x), alpha / rank, jnp.float32)
    np.testing.assert_allclose(np.asarray(got), alpha / rank * want, rtol=1e-5, atol=1e-5)
    w = np.asarray(linear.kernel[...])
    merged = lora.merged_params({"p": {"kernel": w, "lora_a": a, "lora_b": b}}, _scale_cfg(alpha))
    assert set(merged["p"]) == {"kernel"}
    np.testing.assert_allclose(merged["p"]["kernel"], w + alpha / rank * a @ b, rtol=1e-5)


def _scale_cfg(alpha, rank=3):
    class Cfg:
        lora_alpha, lora_rank = alpha, rank

    return Cfg()


def _nll(params, graphdef, tokens, positions, mask):
    logits = nnx.merge(graphdef, params)(tokens, positions, mask).logits[:, :-1]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()


def test_gradients_reach_only_the_adapters_and_the_value_head():
    cfg = _cfg(value_head="shared", tie_embeddings=True)
    graphdef, params = nnx.split(policy_lib.Policy(cfg, nnx.Rngs(0)))

    def loss(p, *args):
        out = nnx.merge(graphdef, p)(*args, with_values=True)
        return _nll(p, graphdef, *args) + jnp.mean(out.values**2 + out.values)

    grads = jax.grad(loss)(params, *_inputs())
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        names = [str(getattr(k, "key", "")) for k in path]
        if "lora_b" in names or ("value_proj" in names and "kernel" in names):
            assert np.any(np.asarray(g)), names  # B and the head's kernel get gradients
        elif "lora_a" not in names and "value_proj" not in names:  # A's is 0 while B = 0
            assert not np.any(np.asarray(g)), names
    assert lora.count(params)[0] == sum(
        x.size for p, x in jax.tree_util.tree_flatten_with_path(params)[0] if lora.is_trainable(p)
    )


def test_masked_optimizer__updates_only_adapters_and_lowers_the_loss():
    cfg = _cfg(targets=("q", "v", "up", "down"))
    graphdef, params = nnx.split(policy_lib.Policy(cfg, nnx.Rngs(0)))
    opt = lora.mask_optimizer(state_lib.make_optimizer(lr=1e-2, weight_decay=0.1))
    opt_state = opt.init(params)
    trainable, total = lora.count(params)
    assert 0 < trainable < total
    # Adam's two moments for the adapters only (plus scalar counts), none for base weights.
    opt_sizes = sum(x.size for x in jax.tree.leaves(opt_state) if x.ndim)
    assert opt_sizes == 2 * trainable
    batch = _inputs(seed=5)

    @jax.jit
    def update(params, opt_state):
        value, grads = jax.value_and_grad(_nll)(params, graphdef, *batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    start = params
    losses = []
    for _ in range(6):
        params, opt_state, value = update(params, opt_state)
        losses.append(float(value))
    losses.append(float(_nll(params, graphdef, *batch)))
    assert losses[-1] < losses[0] - 0.05, losses
    for (path, old), new in zip(
        jax.tree_util.tree_flatten_with_path(start)[0], jax.tree.leaves(params)
    ):
        if lora.is_trainable(path):
            if "lora_b" in str(path):
                assert np.any(np.asarray(old) != np.asarray(new))
        else:  # base weights bit-identical
            np.testing.assert_array_equal(np.asarray(old), np.asarray(new))


def test_settings_are_checked_with_one_line_errors():
    with pytest.raises(ValueError, match=r"model.lora.rank=-1; allowed: an integer >= 0"):
        _cfg(rank=-1)
    with pytest.raises(ValueError, match=r"model.lora.alpha=0.0; allowed"):
        policy_lib.ModelConfig(vocab_size=8, lora_rank=2, lora_alpha=0.0)
    with pytest.raises(ValueError, match=r"model.lora.targets=\('q', 'x'\); allowed: distinct"):
        _cfg(targets=("q", "x"))
    with pytest.raises(ValueError, match=r"model.lora.targets='q'; allowed: a non-empty tuple"):
        _cfg(targets="q")
    _cfg(rank=0, targets=())  # off: the other fields are not read


def test_smollm2_135m_shapes_at_rank_8__trainable_count_and_optimizer_memory():
    """SmolLM2-135M (30 layers, d=576, 9 heads of 64, 3 KV heads, d_ff 1536, vocab 49152,
    tied), all seven targets at rank 8: from shapes only, nothing is allocated."""
    cfg = policy_lib.ModelConfig(
        vocab_size=49152,
        d_model=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        d_ff=1536,
        tie_embeddings=True,
        lora_rank=8,
    )
    params = nnx.state(nnx.eval_shape(lambda: policy_lib.Policy(cfg, nnx.Rngs(0))), nnx.Param)
    trainable, total = lora.count(params)
    d, q, kv, f, r = 576, 576, 192, 1536, 8
    per_layer = r * ((d + q) * 2 + (d + kv) * 2 + (d + f) * 3)  # q, o; k, v; gate, up, down
    assert trainable == 30 * per_layer == 2_442_240
    assert total - trainable == 134_515_008  # the base model
    opt = lora.mask_optimizer(state_lib.make_optimizer(lr=1e-4))
    opt_state = jax.eval_shape(opt.init, params)
    opt_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(opt_state))
    base = nnx.state(
        nnx.eval_shape(lambda: policy_lib.Policy(replace(cfg, lora_rank=0), nnx.Rngs(0))),
        nnx.Param,
    )
    full_state = jax.eval_shape(state_lib.make_optimizer(lr=1e-4).init, base)
    full_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(full_state))
    assert 8 * (total - trainable) <= full_bytes < 8 * (total - trainable) + 64
    assert 8 * trainable <= opt_bytes < 8 * trainable + 64  # two f32 moments (+ counts)
    print(
        f"\nSmolLM2-135M LoRA r=8: trainable {trainable:,} "
        f"({100 * trainable / (total - trainable):.2f}% of the base's {total - trainable:,}); "
        f"AdamW state {opt_bytes / 2**20:.1f} MiB "
        f"(full fine-tuning: {full_bytes / 2**20:.1f} MiB)"
    )


# -- export to transformers ----------------------------------------------------------------

_NEEDS = ("torch", "transformers", "safetensors")
_MISSING = [name for name in _NEEDS if importlib.util.find_spec(name) is None]
hf_only = pytest.mark.skipif(bool(_MISSING), reason=f"not installed: {_MISSING}")


def _tiny_transformers_model(arch):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    common = dict(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
    )
    torch.manual_seed(0)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(**common, tie_word_embeddings=False, rope_theta=1e4)
        )
    else:  # q/k/v biases, tied embeddings
        model = transformers.Qwen2ForCausalLM(
            transformers.Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e6)
        )
    return model.eval()


def _torch_logits(model, tokens):
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(np.array(tokens))).logits.float().numpy()


@hf_only
@pytest.mark.parametrize("arch, targets", [("llama", lora.ALL_TARGETS), ("qwen2", ("q", "down"))])
def test_export_merged__transformers_reloads_the_adapted_model(arch, targets, tmp_path):
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ref = _tiny_transformers_model(arch)
    ref.save_pretrained(tmp_path / "base", safe_serialization=True)
    tokens = np.asarray(_inputs(seed=7)[0])
    policy, cfg = hf.load_pretrained(
        tmp_path / "base", lora_rank=4, lora_alpha=8.0, lora_targets=targets, lora_seed=1
    )
    assert cfg.lora_rank == 4 and cfg.lora_targets == targets
    _, positions, mask = _inputs()
    ours = np.asarray(policy(jnp.asarray(tokens), positions, mask).logits)
    assert np.abs(ours - _torch_logits(ref, tokens)).max() < 1e-4  # B = 0: the checkpoint

    _randomize_adapters(policy, seed=2)
    ours = np.asarray(policy(jnp.asarray(tokens), positions, mask).logits)
    assert np.abs(ours - _torch_logits(ref, tokens)).max() > 1e-2  # the adapters matter
    out = hf.export_pretrained(policy, cfg, tmp_path / "merged")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == hf.SUPPORTED[arch]
    assert np.abs(_torch_logits(reloaded, tokens) - ours).max() < 1e-4
    # On a mesh, the adapters follow their kernel: A its input axis, B its output axis.
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (2, 2, 2))
    placed, _ = hf.load_pretrained(tmp_path / "base", mesh=mesh, lora_rank=4, lora_targets=targets)
    q = nnx.state(placed, nnx.LoRAParam)["model"]["layers"][0]["attn"]["q_proj"]
    assert q["lora_a"][...].sharding.spec == P("fsdp", None)
    assert q["lora_b"][...].sharding.spec == P(None, "tensor")
    # The merged folder loads back as a plain model (no adapters) with the same function.
    plain, plain_cfg = hf.load_pretrained(out)
    assert plain_cfg.lora_rank == 0
    back = np.asarray(plain(jnp.asarray(tokens), positions, mask).logits)
    assert np.abs(back - ours).max() < 1e-4
