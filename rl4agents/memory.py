"""A start-up estimate of per-device memory, computed from the config alone.

`estimate(run, mesh_shape)` adds up, per device, what the train step of a resolved run
(`train.resolve.resolve`) keeps alive (bytes):

  resident, for the whole run:
    parameters        P = sum over parameter arrays of size / (mesh axes it is split over) x
                      bytes (p; 4 for the LoRA adapters, kept in f32 whatever p is)
    optimizer         2 x P_train: AdamW's two moments, in each parameter's dtype (optax's
                      default; `state.make_optimizer` keeps no f32 master copy, and global-norm
                      clipping keeps no state). P_train = P without LoRA; with model.lora.rank
                      > 0 only the adapters and the value head: `lora.mask_optimizer` keeps no
                      state for the frozen base
    reference         1 x P when loss.kl_coef > 0 (the frozen KL reference, adapters included)
    stale parameters  k x P under train.staleness = k > 0 (`TrainState.stale_params`: the
                      sampler's ring of the parameters of the last k updates)
    episode arrays    24 x B x T x 4 / D_b: trajectory, batch and advantage arrays, [B, T] each
  transient, one phase at a time (the peak is resident + the largest phase):
    rollout           KV cache: layers x 2 x B x T_kv x kv_heads x head_dim x c / D_b, plus one
                      prefill chunk of S tokens: B x (S x a(T_kv) + V x 4) / D_b (the
                      prefill computes logits at each row's last token only); when
                      branching under context="full", plus the fork snapshots: K x B_root x
                      layers x 2 x T_kv x kv_heads x head_dim x c / D_b (the roots' KV cache at
                      the start of each of the K turns, `branch.branch_rollout`; nested
                      forks, levels L > 1, add K - k_start turns of B_root (M x N)^l branch
                      rows for each level l = 1..L-1 that forks again)
    scoring           the forward-only passes over the whole batch (reference log-probs, old
                      values, learner log-probs for TIS), when any is on:
                      N x (L x a(L) + R x 3 x V x 4) / D_b (R = L for the values/TIS pass)
    update            gradients (1 x P) + activations + logits of one minibatch of
                      n = N / train.minibatches rows:
                        no remat: n x (L x ((layers - 1) x a(L) + kv + 2 x d_model x c)
                                  + R x a(L)) x trunks / D_b, kv = 4 x (d_model +
                                  2 kv_heads x head_dim) + 8 x (kv_heads x head_dim + d_model)
                                  the last layer's k/v inputs at unscored slots (R = L: n x L
                                  x (layers x a(L) + 2 x d_model x c) x trunks / D_b)
                        remat:    n x L x ((layers + 2) x d_model x c + a(L)) x trunks / D_b
                        logits:   3 x n x R x V x 4 / D_b (logits, log-softmax, its gradient;
                                  R -> min(R, model.logit_chunk) when that is set, here and in
                                  the scoring pass)
    optimizer step    gradients + 3 x P_train: the all-reduced gradients and AdamW's new
                      moments before the old are released (XLA's temporaries for the train
                      step on a data-parallel mesh are 4.00 x parameters when activations
                      are small; without this phase the estimate fell 8-30% below XLA's
                      figure for short episodes); under train.staleness > 0 plus 1 x P, the
                      updated parameters, which cannot overwrite the old ones (those join
                      the ring; XLA's temporaries grew by 0.63 x P at k = 2 on the tiny
                      config, and the estimate without this term fell 1.3% below its figure)
    evaluation        the rollout terms with train.eval_tasks episodes

  One parameter set per role (model.role_params = R >= 2, `models.roles`): the parameters, the
  optimizer moments, the reference and stale copies and the gradients count R sets, and the
  rollout (R KV caches), scoring, activations and logits R passes (vmapped over the sets).

  a(Tk) = 4 x (4 d_model + 3 heads x head_dim + 2 kv_heads x head_dim + 4 d_ff)
          + 8 x (heads + kv_heads) x head_dim + 8 x d_model + (8 + c) x heads x Tk
  is the bytes one layer keeps per token for the backward pass: the normalised inputs, q/k/v,
  the attention output and the MLP's four d_ff-wide tensors (counted at 4 bytes: the norms and
  RoPE compute in f32, and projections with f32 parameters return f32), f32 copies of q/k
  around RoPE and of the norms' inputs, and over the Tk keys two f32 score tensors (before and
  after masking/softmax) plus the compute-dtype probabilities. Fitted to XLA's own memory
  analysis of the policy's backward pass on the CPU backend (per layer and token, f32: 21,406
  bytes measured vs 21,920 here for the `small` preset over 190 slots, 31,487 vs 32,000 over
  400, 32,090 vs 33,440 for `bench`; bf16 compute: 8-11% above the measurement).

Symbols: p, c = bytes of model.param_dtype and model.dtype; V = vocabulary; B = num_tasks x
group_size episodes of T = `rollout.make_layout(...).length` slots, or with a branching rollout
(rollout.branch.rule != "none") B = B_root x (1 + M x N + ... + (M x N)^L) episodes, L =
rollout.branch.levels: B_root = num_tasks x
group_size roots, M fork slots per root (`BranchConfig.fork_slots`: K for rule "every") and N =
rollout.branch.num_branches continuations per fork (`StepConfig.num_rows`; every term that
counts episodes, rollout, scoring and update rows counts these); the update trains on N rows
of L slots (context="full": N = B, L = T minus the final observation block unless ECHO;
"window": N = B x K step rows of L = `window_row_length`), the KV cache holds T_kv = T (or L)
slots and the longest prefill chunk is S = max(prompt, observation) slots (or L - A); the
update computes logits at R slots per row, those an action token can occupy (K x A, or A for a
window row; R = L with ECHO, which also reads observation slots); trunks =
2 when a separate critic decoder runs in the loss; D_b = data x fsdp, the mesh axes the batch
is split over (activations are not counted as split by `tensor`: an upper bound). Parameters,
moments, the reference and stale copies are split as `sharding.tree_shardings` places them
(`embed` over fsdp; heads, MLP units and vocabulary over tensor; a dimension the axes do not
divide stays whole). The `fully sharded` figure is the state (parameters, moments, reference
and stale copies) split evenly over all devices, for comparison.

Under LoRA the activations are counted as without it (the adapters' rank-r products add r
values per adapted projection and token, small beside a(L)), and the gradients as a whole
parameter tree: the frozen base's are zeros (`lora.freeze`), but XLA's temporaries still hold a
tree of the model's size beside the activations (tiny config, one turn, rank 4, 8 devices:
642,472 B measured against 652,704 B for the update phase here; counting the adapters' and
value head's gradients alone put the peak at 0.76 of XLA's figure). A branching rollout's fork
snapshots and its branches' KV cache are counted together, though the snapshots are released
once the branches are forked: an upper bound by B_root rows of cache. Under context="window"
the snapshots hold a few turn blocks of tokens and are not counted.

This is an estimate: XLA fuses, rematerialises and reuses buffers in ways the formulas do not
follow, and the runtime reserves memory of its own. Under `fsdp` > 1 it counts the parameters
split and no gathered copy (an FSDP schedule gathers one layer's weights at a time); XLA on the
CPU backend gathers all layers' weights and keeps several copies, so there the estimate can
fall well below XLA's figure (0.77 and 0.28 of it for the tiny config at one turn on (2, 2, 2)
and (1, 8, 1), `experiments/results/scale/memory.md`). It is
meant to refuse configs that are clearly too large before anything is allocated, and to say
which term dominates.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import ml_collections

from rl4agents import sharding
from rl4agents.models import lora as lora_lib
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import branch as branch_lib
from rl4agents.rollout import rollout as rollout_lib

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ADAPTER_BYTES = 4  # LoRA adapters are f32 whatever model.param_dtype is (`lora.attach`)
EPISODE_ARRAYS = 24  # [B, T] arrays alive through a step (trajectory, batch, advantages)
LOGIT_COPIES = 3  # logits, log-softmax and (backward) its gradient, all f32[rows, L, V]
# Beside the gradients, while the optimizer applies them: their all-reduced copy and AdamW's new
# moments before the old are released (XLA's temporaries for the train step on a data-parallel
# mesh: 4.00 x the parameter bytes, whatever the episode length, when activations are small).
OPTIMIZER_STEP_COPIES = 3


class MeshShape(NamedTuple):
    """The parts of a `jax.sharding.Mesh` that `sharding.logical_spec` reads: no devices."""

    axis_names: tuple[str, ...]
    shape: dict[str, int]


@dataclasses.dataclass(frozen=True)
class Term:
    """One line of the estimate: `nbytes` per device and how it was computed."""

    name: str
    nbytes: int  # bytes per device
    formula: str


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Per-device memory of a config on a mesh (bytes; see the module docstring)."""

    num_params: int  # parameters of the policy (and value head), all devices together
    mesh_shape: dict[str, int]  # axis name -> size
    resident: tuple[Term, ...]  # alive for the whole run
    phases: dict[str, tuple[Term, ...]]  # transient terms, one phase alive at a time
    state_fully_sharded: int  # bytes/device of the state (params, moments, copies) split evenly
    capacity: int | None = None  # device memory in bytes, if known

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh_shape.values())

    @property
    def resident_bytes(self) -> int:
        return sum(t.nbytes for t in self.resident)

    def phase_bytes(self, phase: str) -> int:
        return sum(t.nbytes for t in self.phases[phase])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes)

    @property
    def peak(self) -> int:
        """Estimated peak bytes per device: resident + the largest transient phase."""
        return self.resident_bytes + self.phase_bytes(self.peak_phase)

    def term(self, name: str) -> int:
        """Bytes per device of the term called `name` (0 if absent)."""
        terms = list(self.resident) + [t for ts in self.phases.values() for t in ts]
        return sum(t.nbytes for t in terms if t.name == name)

    def format(self) -> str:
        """A readable breakdown: every term in GiB with its formula, phases, peak, capacity."""
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh_shape.items())
        lines = [
            f"Estimated memory per device ({self.num_devices} devices, mesh {mesh}; "
            f"{self.num_params:,} parameters):",
            "  resident:",
        ]
        width = max(len(t.name) for ts in [self.resident, *self.phases.values()] for t in ts)
        for t in self.resident:
            lines.append(f"    {t.name:<{width}} {format_bytes(t.nbytes):>10}  {t.formula}")
        for phase, terms in self.phases.items():
            mark = "  <- peak" if phase == self.peak_phase else ""
            lines.append(f"  {phase} (transient, {format_bytes(self.phase_bytes(phase))}){mark}:")
            for t in terms:
                lines.append(f"    {t.name:<{width}} {format_bytes(t.nbytes):>10}  {t.formula}")
        lines.append(
            f"  peak = resident {format_bytes(self.resident_bytes)} + {self.peak_phase} "
            f"{format_bytes(self.phase_bytes(self.peak_phase))} = {format_bytes(self.peak)}"
        )
        stale = " + stale copies" if self.term("stale parameters") else ""
        lines.append(
            f"  (parameters + optimizer + reference{stale} split evenly over all "
            f"{self.num_devices} devices would take {format_bytes(self.state_fully_sharded)})"
        )
        if self.capacity:
            lines.append(f"  device memory: {format_bytes(self.capacity)}")
        return "\n".join(lines)


def format_bytes(nbytes: float) -> str:
    """`nbytes` in the largest binary unit that keeps it >= 1: "1.50 GiB", "12.00 KiB"."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{int(nbytes)} B"


def resolve_mesh_shape(
    axes: Sequence[str], shape: Sequence[int], num_devices: int
) -> dict[str, int]:
    """Axis sizes of `mesh.axes` x `mesh.shape` on `num_devices` (one -1 takes the rest).

    Mirrors `sharding.make_mesh` without building devices.

    Raises:
      ValueError: naming mesh.shape when it does not fit `num_devices`.
    """
    shape = list(shape)
    if len(shape) != len(axes) or shape.count(-1) > 1:
        raise ValueError(f"mesh.shape={tuple(shape)} does not match mesh.axes={tuple(axes)}")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(f"mesh.shape={tuple(shape)} does not divide {num_devices} devices")
        shape[shape.index(-1)] = num_devices // known
    if num_devices % math.prod(shape):
        raise ValueError(f"mesh.shape={tuple(shape)} does not divide {num_devices} devices")
    return dict(zip(axes, shape, strict=True))


def param_shapes(cfg: policy_lib.ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter array of `policy.Policy(cfg)` as ("a/b/c" path, shape), built from the
    config (the paths are those `sharding.path_str` gives the model's `nnx.State`), LoRA
    adapters (`lora_a`, `lora_b`) included when `cfg.lora_rank` > 0."""
    d, hd, f, v = cfg.d_model, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    # (in, out) of each projection LoRA can adapt, by its short name (`lora.TARGETS`)
    proj = {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d)}
    proj.update({"gate": (d, f), "up": (d, f), "down": (f, d)})

    def adapters(p: str) -> list[tuple[str, tuple[int, ...]]]:
        """lora_a [in, r] and lora_b [r, out] of every adapted projection of layer `p`."""
        r, out = cfg.lora_rank, []
        for target in cfg.lora_targets if r else ():
            (sub, name), (d_in, d_out) = lora_lib.TARGETS[target], proj[target]
            out += [
                (f"{p}/{sub}/{name}/lora_a", (d_in, r)),
                (f"{p}/{sub}/{name}/lora_b", (r, d_out)),
            ]
        return out

    def decoder(prefix: str) -> list[tuple[str, tuple[int, ...]]]:
        out = [(f"{prefix}/embed/embedding", (v, d))]
        for i in range(cfg.num_layers):
            p = f"{prefix}/layers/{i}"
            out.append((f"{p}/input_norm/scale", (d,)))
            for name, width in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                out.append((f"{p}/attn/{name}/kernel", (d, width)))
                if cfg.qkv_bias:
                    out.append((f"{p}/attn/{name}/bias", (width,)))
            out.append((f"{p}/attn/o_proj/kernel", (q, d)))
            if cfg.qk_norm:
                out += [(f"{p}/attn/q_norm/scale", (hd,)), (f"{p}/attn/k_norm/scale", (hd,))]
            out.append((f"{p}/post_attn_norm/scale", (d,)))
            out += [(f"{p}/mlp/gate_proj/kernel", (d, f)), (f"{p}/mlp/up_proj/kernel", (d, f))]
            out.append((f"{p}/mlp/down_proj/kernel", (f, d)))
            out += adapters(p)
        out.append((f"{prefix}/final_norm/scale", (d,)))
        return out

    shapes = decoder("model")
    if not cfg.tie_embeddings:
        shapes.append(("lm_head/kernel", (d, v)))
    if cfg.value_head == "separate":
        shapes += decoder("critic")
    if cfg.value_head != "none":
        shapes += [("value_proj/kernel", (d, 1)), ("value_proj/bias", (1,))]
    return shapes


def num_params(cfg: policy_lib.ModelConfig) -> int:
    """Parameter count of `policy.Policy(cfg)` (equals `policy.count_params` of its state)."""
    return sum(math.prod(s) for _, s in param_shapes(cfg))


def is_adapter(path: str) -> bool:
    """Whether the parameter at "a/b/c" `path` is a LoRA adapter (`lora_a` or `lora_b`)."""
    return path.rsplit("/", 1)[-1] in lora_lib.PARAM_NAMES


def is_trained(cfg: policy_lib.ModelConfig, path: str) -> bool:
    """Whether the optimizer updates (and keeps AdamW moments for) the parameter at `path`:
    every one without LoRA; with `cfg.lora_rank` > 0 the adapters and the value head only
    (`lora.is_trainable`)."""
    return not cfg.lora_rank or is_adapter(path) or path.split("/", 1)[0] == "value_proj"


def param_elements_per_device(
    cfg: policy_lib.ModelConfig,
    mesh_shape: Mapping[str, int],
    include: Callable[[str], bool] | None = None,
) -> int:
    """Elements of all parameters that one device holds under `sharding.tree_shardings`.

    Args:
      cfg: the model.
      mesh_shape: axis name -> size, e.g. {"data": 8, "fsdp": 1, "tensor": 1}.
      include: counts only the parameters whose "a/b/c" path it accepts (None: all).

    Returns:
      sum over arrays of ceil(size / product of the mesh axes its spec splits it over).
    """
    mesh = MeshShape(tuple(mesh_shape), dict(mesh_shape))
    total = 0
    for path, shape in param_shapes(cfg):
        if include is not None and not include(path):
            continue
        axes = sharding.logical_axes(path)
        if axes is None:
            raise ValueError(f"no sharding rule for parameter {path!r} (shape {shape})")
        spec = sharding.logical_spec(axes, shape, mesh)
        split = 1
        for entry in spec:
            for axis in (entry,) if isinstance(entry, str) else entry or ():
                split *= mesh_shape[axis]
        total += -(-math.prod(shape) // split)
    return total


class ParamBytes(NamedTuple):
    """Parameter bytes of a model on a mesh: all parameters and the trained ones."""

    device: int  # P: bytes per device of every parameter (adapters at 4 B, the rest at p)
    trained_device: int  # P_train: bytes per device of the parameters the optimizer updates
    total: int  # bytes of every parameter, all devices together (unsplit)
    trained_total: int  # bytes of the trained parameters, unsplit


def param_bytes(cfg: policy_lib.ModelConfig, mesh_shape: Mapping[str, int]) -> ParamBytes:
    """P and P_train of the module docstring: sum of elements x bytes, base parameters at
    model.param_dtype's p bytes and LoRA adapters at 4 (f32).

    Without LoRA, P = P_train = (elements per device) x p.
    """
    p = DTYPE_BYTES[cfg.param_dtype]
    no_mesh = {axis: 1 for axis in mesh_shape}

    def nbytes(mesh: Mapping[str, int], trained: bool) -> int:
        def count(adapter: bool) -> int:
            return param_elements_per_device(
                cfg,
                mesh,
                lambda path: is_adapter(path) == adapter and (not trained or is_trained(cfg, path)),
            )

        return count(False) * p + count(True) * ADAPTER_BYTES

    return ParamBytes(
        nbytes(mesh_shape, False),
        nbytes(mesh_shape, True),
        nbytes(no_mesh, False),
        nbytes(no_mesh, True),
    )


def _per_token_layer_bytes(cfg: policy_lib.ModelConfig, keys: int) -> int:
    """a(keys): bytes one layer keeps per token for the backward pass (module docstring)."""
    c = DTYPE_BYTES[cfg.dtype]
    d, hd = cfg.d_model, cfg.head_dim
    linear = 4 * d + 3 * cfg.num_heads * hd + 2 * cfg.num_kv_heads * hd + 4 * cfg.d_ff
    f32_copies = 8 * (cfg.num_heads + cfg.num_kv_heads) * hd + 8 * d
    return 4 * linear + f32_copies + (8 + c) * cfg.num_heads * keys


def _kv_token_bytes(cfg: policy_lib.ModelConfig) -> int:
    """Bytes of a(keys) the last layer still keeps at a slot it does not score: the
    normalised input (and its f32 copy), k and v (and the f32 copy of k around RoPE)."""
    d, kv = cfg.d_model, cfg.num_kv_heads * cfg.head_dim
    return 4 * (d + 2 * kv) + 8 * kv + 8 * d


class StepKnobs(NamedTuple):
    """What a run's train step turns on beyond its config's sizes (`StepConfig` fields)."""

    branch: branch_lib.BranchConfig | None  # the branching rule, or None (off)
    staleness: int  # k parameter copies the sampler's ring keeps (0 = off)


def step_knobs(run: Any) -> StepKnobs:
    """The branching rule and staleness of a run: its `step_cfg`'s when it has one (an
    `Experiment`, or a `Run` resolved with devices), else the `Run`'s own (resolved from its
    config by `train.resolve.resolve`, also with `check_only`)."""
    step_cfg = getattr(run, "step_cfg", None)
    if step_cfg is not None:
        return StepKnobs(step_cfg.branch, step_cfg.staleness)
    return StepKnobs(run.branch, run.staleness)


class _Sizes(NamedTuple):
    """The static sizes the terms need (symbols of the module docstring)."""

    batch: int  # B episodes per rollout (B_root x (1 + M x N) when branching)
    roots: int  # B_root = num_tasks x group_size episodes a branching rollout forks from
    slots: int  # T slots per episode
    rows: int  # N rows the update trains on
    length: int  # L slots per row
    kv_len: int  # T_kv slots of the rollout's KV cache
    chunk: int  # S tokens of the longest prefill chunk
    vocab: int  # V
    split: int  # D_b = data x fsdp
    scored: int  # R slots per row whose logits the update computes (all L with ECHO)

    def per_device(self, nbytes: int) -> int:
        """A batch-dependent term split over data x fsdp (rounded up)."""
        return -(-nbytes // self.split)


def _sizes(run, vocab: int, mesh_shape: Mapping[str, int], knobs: StepKnobs) -> _Sizes:
    config, env, rc, lay = run.config, run.env, run.rollout_cfg, run.layout
    split = math.prod(mesh_shape.get(a, 1) for a in sharding.BATCH_AXES)
    roots = rc.batch_size
    # B_root (1 + M N) episodes with branching (`StepConfig.num_rows`), else B_root
    batch = roots if knobs.branch is None else knobs.branch.num_rows(roots, lay.turns)
    if rc.context == "window":
        row = rollout_lib.window_row_length(env, rc)
        rows = batch * lay.turns
        scored = row if config.loss.echo_coef > 0 else lay.action
        return _Sizes(
            batch, roots, lay.length, rows, row, row, row - lay.action, vocab, split, scored
        )
    echo = config.loss.echo_coef > 0
    length = lay.length if echo else lay.length - lay.obs
    chunk = max(lay.prompt, lay.obs)
    scored = length if echo else lay.turns * lay.action  # `rollout.action_slots`
    return _Sizes(batch, roots, lay.length, batch, length, lay.length, chunk, vocab, split, scored)


def _batch_label(knobs: StepKnobs, sz: _Sizes, turns: int) -> str:
    """How B is written in a formula: "B" or, branching, "B(1 + M x N ...)" with M and N."""
    if knobs.branch is None:
        return "B"
    bc = knobs.branch
    m, n = bc.fork_slots(turns), bc.num_branches
    deeper = "".join(f" + (M x N)^{level}" for level in range(2, bc.levels + 1))
    return f"B_root={sz.roots} x (1 + M={m} x N={n}{deeper}) = B"


def _kv_cache_bytes(cfg: policy_lib.ModelConfig, sz: _Sizes, batch: int) -> int:
    """Bytes of the KV cache of `batch` episodes, all devices together."""
    c = DTYPE_BYTES[cfg.dtype]
    return cfg.num_layers * 2 * batch * sz.kv_len * cfg.num_kv_heads * cfg.head_dim * c


def _fork_snapshots(
    cfg: policy_lib.ModelConfig, sz: _Sizes, turns: int, bc: branch_lib.BranchConfig
) -> Term:
    """The KV cache at the start of each turn of every level that forks again, kept by a
    branching rollout under context="full" to fork from (`branch.branch_rollout`): the roots'
    K turns, and for nested forks (`levels` > 1) the K - k_start turns of the branch rows of
    levels 1..L-1, B_root (M N)^l rows each."""
    c = DTYPE_BYTES[cfg.dtype]
    k_start = min(bc.turns) if bc.rule == "turns" else 0
    rows = turns * sz.roots
    label = f"K={turns} x B_root={sz.roots}"
    mn = bc.fork_slots(turns) * bc.num_branches
    for level in range(1, bc.levels):
        rows += (turns - k_start) * sz.roots * mn**level
        label += f" + {turns - k_start} x {sz.roots * mn**level}"
    if bc.levels > 1:
        label = f"({label} = {rows} rows)"
    return Term(
        "fork snapshots",
        sz.per_device(rows * _kv_cache_bytes(cfg, sz, 1)),
        f"{label} x {cfg.num_layers} layers x 2 x {sz.kv_len} x "
        f"{cfg.num_kv_heads} kv_heads x {cfg.head_dim} x {c} B / {sz.split}",
    )


def _rollout_terms(cfg: policy_lib.ModelConfig, sz: _Sizes, batch: int, label: str):
    """KV cache and one prefill chunk of a rollout of `batch` episodes."""
    c = DTYPE_BYTES[cfg.dtype]
    kv = _kv_cache_bytes(cfg, sz, batch)
    a_kv = _per_token_layer_bytes(cfg, sz.kv_len)
    return (
        Term(
            "KV cache",
            sz.per_device(kv),
            f"{cfg.num_layers} layers x 2 x {label}={batch} x {sz.kv_len} x "
            f"{cfg.num_kv_heads} kv_heads x {cfg.head_dim} x {c} B / {sz.split}",
        ),
        Term(
            "prefill",
            sz.per_device(batch * (sz.chunk * a_kv + sz.vocab * 4)),
            f"{label}={batch} x ({sz.chunk} tokens x a({sz.kv_len})={a_kv:,} B + "
            f"V={sz.vocab} x 4 B at the last token) / {sz.split}",
        ),
    )


def _live_slots(cfg: policy_lib.ModelConfig, scored: int) -> int:
    """Slots per row whose logits are live at once: `model.logit_chunk` of the R scored slots
    when it is set (the head runs over blocks of slots, each recomputed in the backward pass),
    else all R."""
    chunk = getattr(cfg, "logit_chunk", 0)
    return min(scored, chunk) if chunk > 0 else scored


def _slots_label(cfg: policy_lib.ModelConfig, scored: int) -> str:
    live = _live_slots(cfg, scored)
    return f"R={scored}" if live == scored else f"chunk {live} of R={scored}"


def _update_terms(
    cfg: policy_lib.ModelConfig, sz: _Sizes, grad_bytes: int, grad_how: str, config, trunks
):
    """Gradients, activations and logits of one minibatch's forward and backward pass."""
    c, n, length = DTYPE_BYTES[cfg.dtype], -(-sz.rows // config.train.minibatches), sz.length
    a_len = _per_token_layer_bytes(cfg, length)
    if cfg.remat:
        per_row = length * ((cfg.num_layers + 2) * cfg.d_model * c + a_len)
        how = (
            f"n={n} x L={length} x (({cfg.num_layers} + 2) x {cfg.d_model} x {c} B"
            f" + a({length})={a_len:,} B) (remat)"
        )
    elif sz.scored < length:  # the last layer runs its queries and MLP at the R scored slots
        kv = _kv_token_bytes(cfg)
        per_row = (
            length * ((cfg.num_layers - 1) * a_len + kv + 2 * cfg.d_model * c) + sz.scored * a_len
        )
        how = (
            f"n={n} x (L={length} x ({cfg.num_layers - 1} layers x a({length})={a_len:,} B"
            f" + last layer's k/v {kv:,} B + 2 x {cfg.d_model} x {c} B)"
            f" + R={sz.scored} x a({length}))"
        )
    else:
        per_row = length * (cfg.num_layers * a_len + 2 * cfg.d_model * c)
        how = (
            f"n={n} x L={length} x ({cfg.num_layers} layers x a({length})={a_len:,} B"
            f" + 2 x {cfg.d_model} x {c} B)"
        )
    how += (f" x {trunks} trunks" if trunks > 1 else "") + f" / {sz.split}"
    return (
        Term("gradients", grad_bytes, grad_how),
        Term("activations", sz.per_device(n * per_row * trunks), how),
        Term(
            "logits",
            sz.per_device(LOGIT_COPIES * n * _live_slots(cfg, sz.scored) * sz.vocab * 4),
            f"{LOGIT_COPIES} x n={n} x {_slots_label(cfg, sz.scored)} x V={sz.vocab} x 4 B"
            f" / {sz.split}",
        ),
    )


def estimate(
    run: Any,
    mesh_shape: Mapping[str, int],
    *,
    capacity: int | None = None,
    **model_overrides: Any,
) -> Estimate:
    """Per-device memory of training a resolved run on a mesh of `mesh_shape` (nothing
    allocated).

    Args:
      run: a resolved run (`train.resolve.resolve(config, check_only=True)` is enough, or an
        `Experiment`'s): its `config`, `env`, `model_cfg`, `rollout_cfg`, `layout` and
        `needs_values` are read, and the branching rule and staleness of its `step_cfg` (or,
        without one, of its config: `step_knobs`).
      mesh_shape: axis name -> size; its product is the number of devices.
      capacity: device memory in bytes, recorded in the estimate.
      **model_overrides: `ModelConfig` fields replacing the run's (e.g. remat=True, or
        vocab_size=151936 for a Qwen2 tokenizer).

    Returns:
      The `Estimate` (bytes per device).
    """
    config = run.config
    cfg = dataclasses.replace(run.model_cfg, **model_overrides)
    vocab = cfg.vocab_size
    mesh_shape = dict(mesh_shape)
    knobs = step_knobs(run)
    sz = _sizes(run, vocab, mesh_shape, knobs)
    turns = run.layout.turns
    p = DTYPE_BYTES[cfg.param_dtype]
    n_total, n_dev = num_params(cfg), param_elements_per_device(cfg, mesh_shape)
    pb = param_bytes(cfg, mesh_shape)
    num_roles = run.rollout_cfg.role_params if run.rollout_cfg.role_params >= 2 else 1
    pb = ParamBytes(*(num_roles * x for x in pb))  # R stacked role sets
    kl = config.loss.kl_coef > 0
    needs_values = run.needs_values
    split_note = "replicated" if n_dev == n_total else f"{n_total / n_dev:.2f}x split"
    if cfg.lora_rank:
        n_adapters = sum(math.prod(s) for path, s in param_shapes(cfg) if is_adapter(path))
        params_how = (
            f"{n_total - n_adapters:,} frozen x {p} B ({cfg.param_dtype}) + {n_adapters:,} "
            f"LoRA adapters (rank {cfg.lora_rank}) x {ADAPTER_BYTES} B, {n_dev:,} per device "
            f"({split_note})"
        )
        n_trained = sum(math.prod(s) for path, s in param_shapes(cfg) if is_trained(cfg, path))
        trained = f"the {n_trained:,} trained parameters (LoRA adapters + value head)"
        optimizer_how = f"AdamW mu + nu = 2 x {trained}"
        # a gradient for every leaf: the frozen base's are zeros, but XLA keeps them
        grad_how = "1 x parameters (zeros for the frozen base, still materialised)"
        step_how = (
            f"{OPTIMIZER_STEP_COPIES} x {trained} (all-reduced gradients, AdamW's new mu and nu)"
        )
    else:
        params_how = f"{n_total:,} x {p} B ({cfg.param_dtype}), {n_dev:,} per device ({split_note})"
        optimizer_how = f"AdamW mu + nu = 2 x parameters ({cfg.param_dtype})"
        grad_how = "1 x parameters"
        step_how = (
            f"{OPTIMIZER_STEP_COPIES} x parameters (all-reduced gradients, AdamW's new mu and nu)"
        )
    if num_roles > 1:
        params_how += f", x {num_roles} role sets (model.role_params)"
    resident = [
        Term("parameters", pb.device, params_how),
        Term("optimizer", 2 * pb.trained_device, optimizer_how),
    ]
    if kl:
        resident.append(Term("reference", pb.device, "1 x parameters (loss.kl_coef > 0)"))
    if knobs.staleness:
        resident.append(
            Term(
                "stale parameters",
                knobs.staleness * pb.device,
                f"train.staleness={knobs.staleness} x parameters (the sampler's parameter ring)",
            )
        )
    label = _batch_label(knobs, sz, turns)
    resident.append(
        Term(
            "episode arrays",
            sz.per_device(EPISODE_ARRAYS * sz.batch * sz.slots * 4),
            f"{EPISODE_ARRAYS} x {label}={sz.batch} x T={sz.slots} x 4 B / {sz.split}",
        )
    )
    rollout = _rollout_terms(cfg, sz, sz.batch, label)
    if knobs.branch is not None and run.rollout_cfg.context != "window":
        rollout += (_fork_snapshots(cfg, sz, turns, knobs.branch),)
    phases = {"rollout": rollout}
    if kl or needs_values or config.loss.tis_cap > 0:
        a_len = _per_token_layer_bytes(cfg, sz.length)
        # the values / TIS pass computes logits at every slot; the KL reference pass at R
        scored = sz.length if needs_values or config.loss.tis_cap > 0 else sz.scored
        live = _live_slots(cfg, scored)
        scoring = sz.rows * (sz.length * a_len + live * LOGIT_COPIES * vocab * 4)
        phases["scoring"] = (
            Term(
                "scoring pass",
                sz.per_device(scoring),
                f"N={sz.rows} x (L={sz.length} x a({sz.length})={a_len:,} B + "
                f"{_slots_label(cfg, scored)} x "
                f"{LOGIT_COPIES} x V={vocab} x 4 B) / {sz.split}",
            ),
        )
    trunks = 2 if cfg.value_head == "separate" and needs_values else 1
    phases["update"] = _update_terms(cfg, sz, pb.device, grad_how, config, trunks)
    phases["optimizer step"] = (
        Term("gradients", pb.device, grad_how),
        Term("optimizer update", OPTIMIZER_STEP_COPIES * pb.trained_device, step_how),
    )
    if knobs.staleness:
        phases["optimizer step"] += (
            Term(
                "updated parameters",
                pb.device,
                "1 x parameters (train.staleness > 0: the old ones join the sampler's ring, "
                "so the update cannot overwrite them)",
            ),
        )
    phases["evaluation"] = _rollout_terms(cfg, sz, config.train.eval_tasks, "eval_tasks")
    if num_roles > 1:  # every set runs every pass: R KV caches, R activations and logits
        for phase in ("rollout", "scoring", "update", "evaluation"):
            if phase in phases:
                phases[phase] = tuple(
                    t
                    if t.name == "gradients"  # counted with the R sets' parameter bytes
                    else dataclasses.replace(
                        t, nbytes=num_roles * t.nbytes, formula=f"{num_roles} x ({t.formula})"
                    )
                    for t in phases[phase]
                )
    # parameters, the reference and stale copies, and AdamW's two moments of the trained ones
    state_bytes = pb.total * (1 + kl + knobs.staleness) + 2 * pb.trained_total
    return Estimate(
        num_params=n_total,
        mesh_shape=mesh_shape,
        resident=tuple(resident),
        phases=phases,
        state_fully_sharded=-(-state_bytes // math.prod(mesh_shape.values())),
        capacity=capacity,
    )


def device_memory(config: ml_collections.ConfigDict) -> int | None:
    """Bytes of memory per device: `mesh.device_memory_gb` (GiB) if set, else what the JAX
    runtime reports (`bytes_limit` of the first local device), else for CPU devices the host's
    physical memory shared by the local devices, else None (unknown: no check)."""
    gb = config.mesh.get("device_memory_gb", 0.0)
    if gb:
        return int(gb * GIB)
    devices = jax.local_devices()
    stats = devices[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return stats["bytes_limit"]
    if devices[0].platform == "cpu":  # simulated CPU devices share the host's RAM
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, OSError, ValueError):
            return None
        return ram // len(devices)
    return None


def check_fits(
    run: Any,
    num_devices: int,
    device_memory_bytes: int | None,
    *,
    mesh_shape: Mapping[str, int] | None = None,
) -> Estimate:
    """Estimates per-device memory and refuses a run whose peak exceeds the device memory.

    Args:
      run: a resolved run (`estimate`).
      num_devices: devices of the mesh (fills a -1 in `config.mesh.shape`).
      device_memory_bytes: memory per device; None or 0 skips the check.
      mesh_shape: axis name -> size of the actual mesh, if it overrides `config.mesh`.

    Returns:
      The `Estimate`.

    Raises:
      ValueError: the estimated peak exceeds `device_memory_bytes`; the message lists every
        term with its formula and what to change.
    """
    config = run.config
    if mesh_shape is None:
        mesh_shape = resolve_mesh_shape(config.mesh.axes, config.mesh.shape, num_devices)
    est = estimate(run, mesh_shape, capacity=device_memory_bytes or None)
    if device_memory_bytes and est.peak > device_memory_bytes:
        raise ValueError(
            f"model {config.model.get('checkpoint', '') or config.model.preset!r} "
            f"({est.num_params:,} parameters) does not fit: estimated peak "
            f"{format_bytes(est.peak)} per device > {format_bytes(device_memory_bytes)} of "
            "device memory (mesh.device_memory_gb, or what the runtime reports).\n"
            + est.format()
            + "\nTo fit: split the state with mesh.shape (fsdp > 1, e.g. (1, -1, 1)), use more "
            "devices, model.remat=True, model.dtype/param_dtype='bfloat16', fewer episodes "
            "(rollout.num_tasks, rollout.group_size, rollout.branch.num_branches, "
            "train.eval_tasks), a smaller train.staleness or more train.minibatches; set "
            "mesh.device_memory_gb if the device memory is misreported."
        )
    return est
