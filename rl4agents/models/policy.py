"""A Llama/Qwen-style decoder policy in Flax NNX, with a value head and a KV cache.

Architecture: token embedding, N pre-norm blocks of grouped-query attention (RoPE, optional
q/k/v bias as in Qwen2, optional q/k RMSNorm as in Qwen3) and a SwiGLU MLP, a final RMSNorm,
an (optionally tied) LM head, and a value head (`shared` on the policy trunk, or a `separate`
critic decoder).

The forward pass is written for the slot layout (see `rl4agents.types`): callers pass explicit
positions and an attention mask over key slots, so padding inside a sequence is invisible to
the model. The KV cache is an explicit pytree passed in and out; nothing is stored on modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl4agents.models import lora as lora_lib
from rl4agents.models import remat as remat_lib
from rl4agents.models import sampling


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    d_ff: int = 192
    rope_theta: float = 10000.0
    # Llama 3 RoPE frequency scaling, (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings); None = plain RoPE.
    rope_scaling: tuple[float, float, float, float] | None = None
    norm_eps: float = 1e-6
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3
    tie_embeddings: bool = False
    value_head: str = "none"  # "none" | "shared" | "separate"
    dtype: str = "float32"  # compute dtype: "float32" | "bfloat16"
    param_dtype: str = "float32"
    remat: bool = False
    # The cache-free pass (scoring, the update) as a `lax.scan` over the layers' stacked
    # parameters instead of one unrolled block per layer: the compile time of deep models.
    scan_layers: bool = False
    # Query block size of the teacher-forced (no-cache) pass: block [c, c + attn_chunk) attends
    # only keys before its end, which skips the masked upper triangle (0 = one block).
    attn_chunk: int = 128
    # Slots per chunk of the LM head, log-softmax and entropy of `Policy.log_probs` (0 = all
    # slots at once): only a [B, logit_chunk, V] block of logits is live, forward and backward.
    logit_chunk: int = 0
    # LoRA (`rl4agents.models.lora`): adapters of rank `lora_rank` (0 = off) scaled by
    # lora_alpha / lora_rank on the projections named in `lora_targets`; every other
    # parameter but the value head is frozen.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = lora_lib.ALL_TARGETS

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} must be a multiple of "
                f"model.num_kv_heads={self.num_kv_heads}"
            )
        if self.value_head not in ("none", "shared", "separate"):
            raise ValueError(
                f"model.value_head={self.value_head!r}; allowed: 'none', 'shared', 'separate'"
            )
        if self.attn_chunk < 0:
            raise ValueError(f"model.attn_chunk={self.attn_chunk}; allowed: >= 0 (0 = off)")
        if self.logit_chunk < 0:
            raise ValueError(f"model.logit_chunk={self.logit_chunk}; allowed: >= 0 (0 = off)")
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in ("float32", "bfloat16"):
                raise ValueError(
                    f"model.{field}={getattr(self, field)!r}; allowed: 'float32', 'bfloat16'"
                )
        lora_lib.check_settings(self.lora_rank, self.lora_alpha, self.lora_targets)


PRESETS = {
    "tiny": dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=192),
    "small": dict(d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, d_ff=384),
    # The peers' benchmark model (Qwen2 layout, 3.2M parameters).
    "bench": dict(
        d_model=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        d_ff=688,
        qkv_bias=True,
    ),
    "qwen2_0.5b": dict(
        d_model=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        d_ff=4864,
        qkv_bias=True,
        tie_embeddings=True,
        rope_theta=1e6,
    ),
    "qwen2_1.5b": dict(
        d_model=1536,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        d_ff=8960,
        qkv_bias=True,
        tie_embeddings=True,
        rope_theta=1e6,
    ),
    "llama_1b": dict(
        d_model=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        d_ff=8192,
        tie_embeddings=True,
        rope_theta=500000.0,
    ),
    "qwen2_7b": dict(
        d_model=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        d_ff=18944,
        qkv_bias=True,
        rope_theta=1e6,
    ),
}


class LayerCache(NamedTuple):
    k: jax.Array  # [B, KV, hd, T] keys, transposed: q @ k is a plain matmul over the cache
    v: jax.Array  # [B, KV, T, hd]


class Output(NamedTuple):
    logits: jax.Array  # f32[B, S, V]
    values: jax.Array | None  # f32[B, S] or None
    cache: tuple[LayerCache, ...] | None


class Features(NamedTuple):
    hidden: jax.Array  # [B, S, D] final-norm hidden states, in the compute dtype
    values: jax.Array | None  # f32[B, S] or None
    cache: tuple[LayerCache, ...] | None


class ForkPrefix(NamedTuple):
    """Static plan of a branching batch whose branch rows share a prefix with their root.

    Rows: `roots` roots first, then roots x M x `branches` branch rows in (root, fork slot,
    branch) order, M = len(prefix). The first `prefix[m]` slots of a branch row of fork slot m
    hold its root's tokens and validity (or, for a slot its root never forked at, only the
    prompt's tokens are valid there and they equal the root's).
    """

    roots: int  # B
    branches: int  # N
    prefix: tuple[int, ...]  # [M] slots each fork slot's rows share with their root


def _dtype(name: str):
    return jnp.bfloat16 if name == "bfloat16" else jnp.float32


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, param_dtype, frozen: bool = False):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps
        self.frozen = frozen  # no gradient to the scale (a base weight under LoRA)

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        scale = lora_lib.freeze(self.scale[...], self.frozen)
        return (xf * scale.astype(jnp.float32)).astype(x.dtype)


def rope(
    x: jax.Array,
    positions: jax.Array,
    theta: float,
    scaling: tuple[float, float, float, float] | None = None,
) -> jax.Array:
    """Rotary embedding (half-split convention of Llama/Qwen in HF). x: [B, S, H, hd].

    `scaling` = (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
    applies Llama 3's frequency scaling (HF `rope_type="llama3"`).
    """
    hd = x.shape[-1]
    freq = theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)  # [hd/2]
    if scaling is not None:
        factor, low, high, old_len = scaling
        wavelen = 2 * jnp.pi / freq
        scaled = jnp.where(wavelen > old_len / low, freq / factor, freq)
        smooth = (old_len / wavelen - low) / (high - low)
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        freq = jnp.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    angles = positions.astype(jnp.float32)[..., None] * freq  # [B, S, hd/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _accumulate(dtype):
    """`preferred_element_type` of a product in compute dtype `dtype`: bf16 products
    accumulate in and return f32 (as CPU bf16 dot units and GPU tensor cores compute them);
    None leaves f32 products as they are."""
    return jnp.float32 if dtype == jnp.bfloat16 else None


def _dense(rngs, d_in, d_out, param_dtype, bias=False, dtype=None):
    """A linear layer whose inputs and kernel are cast to the compute dtype `dtype`.

    Without `dtype`, `nnx.Linear` would promote to the wider of the two, running bf16
    activations times f32 master weights as an f32 product. A bf16 product returns f32 (see
    `_accumulate`); callers cast it back to the compute dtype.
    """
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=bias,
        dtype=dtype,
        param_dtype=param_dtype,
        preferred_element_type=_accumulate(dtype),
        rngs=rngs,
        kernel_init=nnx.initializers.normal(0.02),
    )


def attend(q, k, v, mask, dtype):
    """Grouped-query attention over a KV cache's layout.

    Args:
      q: [B, S, KV, G, hd] queries (G query heads per key/value head).
      k: [B, KV, hd, Tk] keys (transposed).
      v: [B, KV, Tk, hd] values.
      mask: bool[B, S, Tk'] with Tk' <= Tk: which of the first Tk' keys each query sees; keys
        from Tk' on are not read at all.
      dtype: compute dtype of the probabilities and the output.

    Returns:
      [B, S, KV, G, hd]. Scores and softmax are f32. The G heads of a key/value head are
      folded into the query rows and the keys are stored transposed, so both products are
      plain row-major matmuls batched over (B, KV) that read the cache as it lies: a decode
      step does not repack or copy the cache (a 5-D einsum over [B, KV, T, hd] keys did).
    """
    b, s, n, g, hd = q.shape
    t = mask.shape[-1]
    k, v = k[..., :t].astype(dtype), v[:, :, :t].astype(dtype)
    qf = jnp.transpose(q, (0, 2, 3, 1, 4)).reshape(b, n, g * s, hd)
    scores = jnp.einsum("bnqh,bnht->bnqt", qf, k, preferred_element_type=jnp.float32)
    scores = scores.reshape(b, n, g, s, t) / jnp.sqrt(jnp.float32(hd))
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.float32(-1e30))
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype).reshape(b, n, g * s, t)
    out = jnp.einsum("bnqt,bnth->bnqh", probs, v, preferred_element_type=_accumulate(dtype))
    out = out.astype(dtype).reshape(b, n, g, s, hd)
    return jnp.transpose(out, (0, 3, 1, 2, 4))


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        pd, dt = _dtype(cfg.param_dtype), _dtype(cfg.dtype)
        self.cfg = cfg
        h, kv, hd, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model
        self.q_proj = _dense(rngs, d, h * hd, pd, cfg.qkv_bias, dt)
        self.k_proj = _dense(rngs, d, kv * hd, pd, cfg.qkv_bias, dt)
        self.v_proj = _dense(rngs, d, kv * hd, pd, cfg.qkv_bias, dt)
        self.o_proj = _dense(rngs, h * hd, d, pd, dtype=dt)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.norm_eps, pd, frozen=cfg.lora_rank > 0)
            self.k_norm = RMSNorm(hd, cfg.norm_eps, pd, frozen=cfg.lora_rank > 0)
        for name in lora_lib.targets_in(cfg, "attn"):
            lora_lib.attach(getattr(self, name), cfg.lora_rank, rngs)

    def __call__(
        self,
        x,
        positions,
        mask,
        cache: LayerCache | None,
        write_index,
        rows=None,
        prefix_kv: LayerCache | None = None,
    ):
        """Keys and values of all S slots; queries (and outputs) at `rows` (int32[B, R]) only,
        or at every slot.

        Without a cache, returns this chunk's keys and values (`LayerCache` of S slots) in the
        cache's place. `prefix_kv` (keys [B, KV, hd, P], values [B, KV, P, hd]): keys and values
        of P slots before these S, which the queries attend to as well (mask: bool[B, S, P + S]).
        """
        cfg = self.cfg
        dt = _dtype(cfg.dtype)
        b, s, _ = x.shape
        kv_shape = (b, s, cfg.num_kv_heads, cfg.head_dim)
        q_pos = positions
        if rows is None:  # queries at every slot: q, k and v as one matmul (as `MLP`)
            q, k, v = self._qkv(x)
        else:
            k, v = self._proj("k_proj", x), self._proj("v_proj", x)
            x = jnp.take_along_axis(x, rows[..., None], axis=1)
            q_pos = jnp.take_along_axis(positions, rows, axis=1)
            mask = jnp.take_along_axis(mask, rows[..., None], axis=1)
            q = self._proj("q_proj", x)
        k, v = k.astype(dt).reshape(kv_shape), v.astype(dt).reshape(kv_shape)
        q = q.astype(dt).reshape(b, x.shape[1], cfg.num_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = rope(q, q_pos, cfg.rope_theta, cfg.rope_scaling)
        k = rope(k, positions, cfg.rope_theta, cfg.rope_scaling)
        # The cache layout (see `attend`): keys [B, KV, hd, T], values [B, KV, T, hd].
        k = jnp.transpose(k, (0, 2, 3, 1))
        v = jnp.swapaxes(v, 1, 2)
        cached = cache is not None
        if cached:
            k_all = jax.lax.dynamic_update_slice(
                cache.k, k.astype(cache.k.dtype), (0, 0, 0, write_index)
            )
            v_all = jax.lax.dynamic_update_slice(
                cache.v, v.astype(cache.v.dtype), (0, 0, write_index, 0)
            )
            cache = LayerCache(k_all, v_all)
        else:
            k_all, v_all = k, v
            cache = LayerCache(k, v)
        offset = 0
        if prefix_kv is not None:
            offset = prefix_kv.k.shape[-1]
            k_all = jnp.concatenate([prefix_kv.k.astype(dt), k_all], axis=-1)
            v_all = jnp.concatenate([prefix_kv.v.astype(dt), v_all], axis=2)
        groups = cfg.num_heads // cfg.num_kv_heads
        q = q.reshape(b, q.shape[1], cfg.num_kv_heads, groups, cfg.head_dim)
        chunk = cfg.attn_chunk
        if not cached and rows is None and chunk and s > chunk:
            # Causal query blocks: block [c0, c1) can only attend keys before c1, so the
            # scores of later keys (all masked) are never computed.
            out = jnp.concatenate(
                [
                    attend(q[:, c0:c1], k_all, v_all, mask[:, c0:c1, : offset + c1], dt)
                    for c0, c1 in ((c, min(c + chunk, s)) for c in range(0, s, chunk))
                ],
                axis=1,
            )
        else:
            out = attend(q, k_all, v_all, mask, dt)
        out = out.reshape(b, q.shape[1], cfg.num_heads * cfg.head_dim)
        return self._proj("o_proj", out).astype(dt), cache

    def _proj(self, name, x):
        """Projection `name` of x: the plain `nnx.Linear` call, or under LoRA its frozen base
        plus its adapter when `name` is a target."""
        if not self.cfg.lora_rank:
            return getattr(self, name)(x)
        adapt = name in lora_lib.targets_in(self.cfg, "attn")
        return lora_lib.project(getattr(self, name), x, self.cfg, adapt)

    def _qkv(self, x):
        """q, k, v projections of x as one matmul over the concatenated kernels (and biases),
        in the compute dtype as each `_dense` layer computes. One wider product instead of
        three makes the update's forward + backward faster, and decode steps a little
        (`scripts/bench_fusions.py`)."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        lora = self.cfg.lora_rank > 0
        w = lora_lib.freeze(jnp.concatenate([p.kernel[...] for p in projs], axis=1), lora)
        ct = _dtype(self.cfg.dtype)
        y = jnp.dot(x.astype(ct), w.astype(ct), preferred_element_type=_accumulate(ct))
        if self.cfg.qkv_bias:
            bias = lora_lib.freeze(jnp.concatenate([p.bias[...] for p in projs]), lora)
            y = y + bias.astype(y.dtype)
        q_width = self.q_proj.kernel.shape[1]
        out = jnp.split(y, [q_width, q_width + self.k_proj.kernel.shape[1]], axis=-1)
        if lora:  # each target's adapter on its own slice of the fused product
            adapted = lora_lib.targets_in(self.cfg, "attn")
            factor = lora_lib.scale(self.cfg)
            out = [
                y_i + lora_lib.delta(p, x, factor, ct) if name in adapted else y_i
                for y_i, p, name in zip(out, projs, ("q_proj", "k_proj", "v_proj"))
            ]
        return out


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        pd, dt = _dtype(cfg.param_dtype), _dtype(cfg.dtype)
        self.gate_proj = _dense(rngs, cfg.d_model, cfg.d_ff, pd, dtype=dt)
        self.up_proj = _dense(rngs, cfg.d_model, cfg.d_ff, pd, dtype=dt)
        self.down_proj = _dense(rngs, cfg.d_ff, cfg.d_model, pd, dtype=dt)
        self.dtype = dt
        self.cfg = cfg
        for name in lora_lib.targets_in(cfg, "mlp"):
            lora_lib.attach(getattr(self, name), cfg.lora_rank, rngs)

    def __call__(self, x):
        # Gate and up projections as one matmul (as each `_dense` layer computes: inputs and
        # kernel in the compute dtype); one wide product is faster forward and backward.
        cfg = self.cfg
        w = jnp.concatenate([self.gate_proj.kernel[...], self.up_proj.kernel[...]], axis=1)
        w = lora_lib.freeze(w, cfg.lora_rank > 0)
        ct = self.dtype
        y = jnp.dot(x.astype(ct), w.astype(ct), preferred_element_type=_accumulate(ct))
        if not cfg.lora_rank:
            gate, up = jnp.split(y.astype(self.dtype), 2, axis=-1)
            return self.down_proj(jax.nn.silu(gate) * up).astype(self.dtype)
        adapted = lora_lib.targets_in(cfg, "mlp")
        factor = lora_lib.scale(cfg)
        gate, up = jnp.split(y, 2, axis=-1)
        if "gate_proj" in adapted:
            gate = gate + lora_lib.delta(self.gate_proj, x, factor, ct)
        if "up_proj" in adapted:
            up = up + lora_lib.delta(self.up_proj, x, factor, ct)
        h = jax.nn.silu(gate.astype(self.dtype)) * up.astype(self.dtype)
        down = lora_lib.project(self.down_proj, h, cfg, "down_proj" in adapted)
        return down.astype(self.dtype)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        pd = _dtype(cfg.param_dtype)
        frozen = cfg.lora_rank > 0
        self.input_norm = RMSNorm(cfg.d_model, cfg.norm_eps, pd, frozen)
        self.attn = Attention(cfg, rngs)
        self.post_attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, pd, frozen)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x, positions, mask, cache, write_index, rows=None, prefix_kv=None):
        h, cache = self.attn(
            self.input_norm(x), positions, mask, cache, write_index, rows, prefix_kv
        )
        if rows is not None:
            x = jnp.take_along_axis(x, rows[..., None], axis=1)
        x = x + h
        x = x + self.mlp(self.post_attn_norm(x))
        return x, cache


class Decoder(nnx.Module):
    """Embedding, blocks, final norm. Returns hidden states [B, S, D]."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        pd = _dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = nnx.Embed(
            cfg.vocab_size,
            cfg.d_model,
            param_dtype=pd,
            rngs=rngs,
            embedding_init=nnx.initializers.normal(0.02),
        )
        self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps, pd, cfg.lora_rank > 0)

    def _embed(self, tokens):
        """Token embeddings in the compute dtype (the table frozen under LoRA)."""
        if not self.cfg.lora_rank:
            return self.embed(tokens).astype(_dtype(self.cfg.dtype))
        table = lora_lib.freeze(self.embed.embedding[...], True)
        return jnp.take(table, tokens, axis=0).astype(_dtype(self.cfg.dtype))

    def __call__(
        self,
        tokens,
        positions,
        mask,
        cache=None,
        write_index=0,
        rows=None,
        prefix=0,
        group=1,
        shard=None,
        forks: ForkPrefix | None = None,
    ):
        """Hidden states [B, S, D], or [B, R, D] at `rows` (int32[B, R]): the last layer then
        computes its queries, attention output and MLP at those slots only.

        `shard` (optional): applied to the [B, S, D] hidden states entering and leaving every
        layer, e.g. `sharding.batch_constraint(mesh)`. It pins their batch
        axis to the devices, so that with parameters split over `fsdp` XLA gathers the weights
        a layer needs (FSDP) instead of splitting the products' contraction and keeping the
        whole batch's activations on every device.

        `prefix` > 0 (no cache): the first `prefix` slots of each run of `group` consecutive
        rows are the same (the G samples of a task share its prompt); they are computed once
        per group, and the other slots attend the group's keys and values (gradients flow back
        to the shared pass). Equal to the pass without sharing when the first `prefix` slots
        (tokens and mask rows) are equal within each group.

        `forks` (no cache): a branching batch (`ForkPrefix`); each branch row takes its root's
        keys and values of the slots it shares (see `_forked_prefix`).
        """
        if forks is not None:
            if cache is not None or prefix:
                raise ValueError(
                    f"forks={forks} with a cache or prefix={prefix}; allowed: the cache-free "
                    "pass without a shared prompt"
                )
            return self._forked_prefix(tokens, positions, mask, rows, forks, shard)
        if prefix:
            if cache is not None:
                raise ValueError("a shared prefix is for the cache-free pass only")
            return self._shared_prefix(tokens, positions, mask, rows, prefix, group, shard)
        pin = shard or (lambda x: x)
        x = pin(self._embed(tokens))
        new_cache = []
        last = len(self.layers) - 1
        if cache is None and self.cfg.scan_layers:

            def body(layer, x):
                return pin(self._layer(layer, x, positions, mask, None, 0, None)[0])

            x = self._scan(body, x, self.layers[:last])
            x, _ = self._layer(self.layers[last], x, positions, mask, None, 0, rows)
            return self.final_norm(pin(x)), None
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache[i]
            layer_rows = rows if i == last else None
            x, c = self._layer(layer, x, positions, mask, layer_cache, write_index, layer_rows)
            x = pin(x)
            if cache is not None:
                new_cache.append(c)
        return self.final_norm(x), (None if cache is None else tuple(new_cache))

    def _layer(self, layer, x, positions, mask, cache, write_index, rows, prefix_kv=None):
        if self.cfg.remat and cache is None:
            graphdef, state = nnx.split(layer)

            def run(state, x, positions, mask, rows, prefix_kv):
                return nnx.merge(graphdef, state)(x, positions, mask, None, 0, rows, prefix_kv)

            # The activations wait for the cotangent (`remat.checkpoint`): `nnx.remat` keeps
            # every layer's intermediates on XLA's CPU backend.
            return remat_lib.checkpoint(run, anchored=(1, 5))(
                state, x, positions, mask, rows, prefix_kv
            )
        return layer(x, positions, mask, cache, write_index, rows, prefix_kv)

    def _scan(self, body, carry, layers):
        """`carry = body(layer, carry)` for each of `layers` in order: a `lax.scan` over their
        stacked states when `model.scan_layers` (else a Python loop), so that the program
        holds one copy of a block
        (and of its backward pass) instead of one per layer. XLA's compile time grows faster
        than linearly with the number of unrolled blocks: the update of a 30-layer model takes
        minutes to compile unrolled (docs/real_model.md, "Compile time and rematerialisation")."""
        if not self.cfg.scan_layers or len(layers) < 2:
            for layer in layers:
                carry = body(layer, carry)
            return carry
        graphdef = nnx.graphdef(layers[0])
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *(nnx.state(x) for x in layers))

        def step(carry, state):
            return body(nnx.merge(graphdef, state), carry), None

        return jax.lax.scan(step, carry, stacked)[0]

    def _shared_prefix(self, tokens, positions, mask, rows, prefix, group, shard=None):
        b, t = tokens.shape
        if b % group or not 0 < prefix < t:
            raise ValueError(
                f"shared prefix of {prefix} slots over groups of {group} rows does not fit "
                f"{b} rows of {t} slots; allowed: group divides the rows, 0 < prefix < slots"
            )

        def lead(x):  # the first row of each group
            return x.reshape(b // group, group, *x.shape[1:])[:, 0]

        def per_row(x):  # [B/G, ...] -> [B, ...], each group's value on its G rows
            return jnp.repeat(x, group, axis=0)

        pin = shard or (lambda x: x)  # the B rows only: B / group need not divide the devices
        pos_p, mask_p = lead(positions)[:, :prefix], lead(mask)[:, :prefix, :prefix]
        pos_r, mask_r = positions[:, prefix:], mask[:, prefix:]
        x_p = self._embed(lead(tokens)[:, :prefix])
        x_r = pin(self._embed(tokens[:, prefix:]))
        last = len(self.layers) - 1
        rows_r = None if rows is None else jnp.maximum(rows - prefix, 0)

        def body(layer, xs, rows=None):
            x_p, x_r = xs
            x_p, kv = self._layer(layer, x_p, pos_p, mask_p, None, 0, None)
            kv = LayerCache(per_row(kv.k), per_row(kv.v))
            x_r, _ = self._layer(layer, x_r, pos_r, mask_r, None, 0, rows, kv)
            return x_p, pin(x_r)

        xs = self._scan(body, (x_p, x_r), self.layers[:last])
        x_p, x_r = body(self.layers[last], xs, rows_r)
        h_p = per_row(x_p)
        if rows is None:
            hidden = jnp.concatenate([h_p, x_r], axis=1)
        else:
            at_p = jnp.take_along_axis(h_p, jnp.minimum(rows, prefix - 1)[..., None], axis=1)
            hidden = jnp.where((rows < prefix)[..., None], at_p, x_r)
        return self.final_norm(hidden), None

    def _forked_prefix(self, tokens, positions, mask, rows, forks: ForkPrefix, shard=None):
        """The pass over a branching batch, computing each root's shared prefix once.

        The B roots run the whole pass and keep every layer's keys and values. The B x N rows
        of fork slot m then compute slots [p_m, S) only (p_m = `forks.prefix[m]`), attending
        their root's keys and values of slots [0, p_m) as `_shared_prefix`'s rows attend their
        group's; their hidden states at slots < p_m are the root's. By causality the hidden
        state of slot s reads slots <= s only, so this equals the unshared pass (up to float
        summation order) at every slot whose row agrees with its root on slots <= s (tokens
        and validity), which holds at every valid slot of a row `ForkPrefix` describes.
        Gradients of the shared slots flow back to the roots' pass.

        Cost: the roots' S slots plus S - p_m slots per branch row of slot m, in place of S per
        row; the roots' last layer runs at every slot even with `rows` (branch rows read its
        hidden states at their shared slots).

        Args: as `__call__`, with tokens, positions int32[B (1 + M N), S] and mask
        bool[B (1 + M N), S, S] in `forks`' row order. Returns (hidden [B (1 + M N), S, D],
        or R in place of S given `rows`, None).
        """
        b_all, t = tokens.shape
        b, n, pre = forks.roots, forks.branches, forks.prefix
        m_slots = len(pre)
        if b_all != b * (1 + m_slots * n) or not all(0 < p < t for p in pre):
            raise ValueError(
                f"forks={forks} does not fit {b_all} rows of {t} slots; allowed: roots x "
                f"(1 + len(prefix) x branches) rows and every prefix in (0, {t})"
            )
        pin = shard or (lambda x: x)
        last = len(self.layers) - 1
        x = pin(self._embed(tokens[:b]))
        root_kv = []
        for layer in self.layers:  # the roots' last layer runs at every slot: branches read it
            x, kv = self._layer(layer, x, positions[:b], mask[:b], None, 0, None)
            x = pin(x)
            root_kv.append(kv)

        def fork_rows(a, m):  # the B x N rows of fork slot m, in (root, branch) order
            a = a[b:].reshape(b, m_slots, n, *a.shape[1:])[:, m]
            return a.reshape(b * n, *a.shape[2:])

        def per_branch(a):  # [B, ...] -> [B x N, ...], each root's value on its N rows
            return jnp.repeat(a, n, axis=0)

        hidden = []
        for m, p in enumerate(pre):
            x_r = pin(self._embed(fork_rows(tokens, m)[:, p:]))
            pos_r, mask_r = fork_rows(positions, m)[:, p:], fork_rows(mask, m)[:, p:]
            rows_m = None if rows is None else fork_rows(rows, m)
            rows_r = None if rows is None else jnp.maximum(rows_m - p, 0)
            for i, layer in enumerate(self.layers):
                kv = LayerCache(
                    per_branch(root_kv[i].k[..., :p]), per_branch(root_kv[i].v[:, :, :p])
                )
                x_r, _ = self._layer(
                    layer, x_r, pos_r, mask_r, None, 0, rows_r if i == last else None, kv
                )
                x_r = pin(x_r)
            h_p = per_branch(x[:, :p])
            if rows is None:
                h = jnp.concatenate([h_p, x_r], axis=1)
            else:
                at_p = jnp.take_along_axis(h_p, jnp.minimum(rows_m, p - 1)[..., None], axis=1)
                h = jnp.where((rows_m < p)[..., None], at_p, x_r)
            hidden.append(h.reshape(b, n, *h.shape[1:]))
        branches = jnp.stack(hidden, axis=1).reshape(b * m_slots * n, *hidden[0].shape[2:])
        roots = x if rows is None else jnp.take_along_axis(x, rows[:b][..., None], axis=1)
        return self.final_norm(jnp.concatenate([roots, branches], axis=0)), None


class Policy(nnx.Module):
    """Decoder LM with an optional value head (`shared` trunk or `separate` critic)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        pd = _dtype(cfg.param_dtype)
        self.cfg = cfg
        self.model = Decoder(cfg, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = _dense(rngs, cfg.d_model, cfg.vocab_size, pd, dtype=_dtype(cfg.dtype))
        if cfg.value_head == "separate":
            self.critic = Decoder(cfg, rngs)
        if cfg.value_head != "none":
            self.value_proj = nnx.Linear(
                cfg.d_model, 1, param_dtype=pd, rngs=rngs, kernel_init=nnx.initializers.zeros
            )

    def logits(self, hidden):
        lora = self.cfg.lora_rank > 0  # the head is a frozen base weight
        if self.cfg.tie_embeddings:
            w = lora_lib.freeze(self.model.embed.embedding[...], lora)
            return jnp.einsum(
                "bsd,vd->bsv", hidden, w.astype(hidden.dtype), preferred_element_type=jnp.float32
            )
        if lora:
            return lora_lib.project(self.lm_head, hidden, self.cfg, False).astype(jnp.float32)
        return self.lm_head(hidden).astype(jnp.float32)

    def log_probs(
        self, hidden: jax.Array, targets: jax.Array, temperature: float = 1.0
    ) -> tuple[jax.Array, jax.Array]:
        """Log-prob of `targets` (int32[B, R]) and entropy under softmax(logits / temperature)
        at hidden states [B, R, D] (`features`), f32[B, R] each; the head and log-softmax run
        `cfg.logit_chunk` slots at a time (`sampling.token_log_probs`)."""
        return sampling.token_log_probs(
            self.logits, hidden, targets, temperature, self.cfg.logit_chunk
        )

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: tuple[LayerCache, ...] | None = None,
        write_index: jax.Array | int = 0,
        with_values: bool = False,
        rows: jax.Array | None = None,
        prefix: int = 0,
        group: int = 1,
        shard: Callable[[jax.Array], jax.Array] | None = None,
        forks: ForkPrefix | None = None,
    ) -> Output:
        """Forward pass.

        Args:
          tokens: int32[B, S] input tokens.
          positions: int32[B, S] RoPE positions (count of valid tokens before each slot).
          mask: bool[B, S, Tk] attention mask over key slots (Tk = S without a cache, or the
            cache length T with one). It must be causal (no key after its query's slot):
            without a cache, queries are processed in blocks of `attn_chunk` that never read
            later keys.
          cache: per-layer KV cache (k [B, KV, hd, T], v [B, KV, T, hd]); the S new keys are
            written at `write_index` before attending.
          write_index: int32[] slot where this chunk starts in the cache.
          with_values: also return the value head's output.
          rows: optional int32[B, R]: return outputs at these slots only (every slot's keys
            and values still enter the cache). A prefill that needs the last token's logits
            skips the last layer's queries, attention output and MLP everywhere else.
          prefix, group: static ints; without a cache, the first `prefix` slots of each run of
            `group` consecutive rows are equal (a task's prompt, shared by its G samples) and
            are computed once per run (see `Decoder`). 0 = no sharing.
          shard: optional constraint on the [B, S, D] hidden states at every layer boundary
            (see `Decoder`); trainers pass their batch sharding. Values are unchanged.
          forks: optional static `ForkPrefix`: without a cache, a branching batch whose
            branch rows take their root's keys and values of the slots they share (see
            `Decoder`). None = every row computes every slot.

        Returns:
          Output(logits f32[B, S, V], values f32[B, S] or None, updated cache or None), with
          R in place of S given `rows`.
        """
        hidden, values, cache = self.features(
            tokens,
            positions,
            mask,
            cache,
            write_index,
            with_values,
            rows,
            prefix,
            group,
            shard,
            forks,
        )
        return Output(self.logits(hidden), values, cache)

    def features(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: tuple[LayerCache, ...] | None = None,
        write_index: jax.Array | int = 0,
        with_values: bool = False,
        rows: jax.Array | None = None,
        prefix: int = 0,
        group: int = 1,
        shard: Callable[[jax.Array], jax.Array] | None = None,
        forks: ForkPrefix | None = None,
    ) -> Features:
        """The forward pass up to the LM head (arguments as `__call__`): hidden states
        [B, S, D] (R in place of S given `rows`) for `logits` or `log_probs`, values, cache."""
        hidden, cache = self.model(
            tokens, positions, mask, cache, write_index, rows, prefix, group, shard, forks
        )
        values = None
        if with_values and self.cfg.value_head == "shared":
            values = self.value_proj(hidden).astype(jnp.float32)[..., 0]
        elif with_values and self.cfg.value_head == "separate":
            critic_hidden, _ = self.critic(
                tokens,
                positions,
                mask,
                rows=rows,
                prefix=prefix,
                group=group,
                shard=shard,
                forks=forks,
            )
            values = self.value_proj(critic_hidden).astype(jnp.float32)[..., 0]
        return Features(hidden, values, cache)


def init_cache(cfg: ModelConfig, batch: int, length: int) -> tuple[LayerCache, ...]:
    """Zero KV cache for `batch` rows of `length` slots (keys transposed, see `LayerCache`)."""
    k_shape = (batch, cfg.num_kv_heads, cfg.head_dim, length)
    v_shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
    dt = _dtype(cfg.dtype)
    return tuple(
        LayerCache(jnp.zeros(k_shape, dt), jnp.zeros(v_shape, dt)) for _ in range(cfg.num_layers)
    )


def make_config(preset: str, vocab_size: int, **overrides) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"model.preset={preset!r}; allowed: {sorted(PRESETS)}")
    return ModelConfig(vocab_size=vocab_size, **{**PRESETS[preset], **overrides})


def count_params(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))
