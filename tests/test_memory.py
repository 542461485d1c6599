"""Memory estimate: exact state sizes, hand-computed terms, refusal with the numbers."""

import math
import re

import jax
import numpy as np
import pytest
from flax import nnx

from rl4agents import memory, sharding
from rl4agents.models import lora, policy
from rl4agents.train import experiment, loop, resolve
from tests.train.test_train import tiny_config


def _run(config):
    """The resolved run of `config` (no devices, no model): what `memory.estimate` reads."""
    return resolve.resolve(config, check_only=True)


MESH8 = {"data": 8, "fsdp": 1, "tensor": 1}
# The tiny config (tests/train/test_train.py): frozen_lake with the minimal vocabulary.
V = 16  # minimal tokenizer of frozen_lake
B = 8  # 4 tasks x 2 samples
T = 93  # prompt 21 + 3 turns x (1 action + 23 observation slots)
L = 70  # T minus the final observation block (not trained on)
D, LAYERS, HEADS, KV_HEADS, HEAD_DIM, D_FF = 64, 2, 4, 2, 16, 192
# Per layer: 2 norms + q, k, v, o + gate, up, down (no biases, untied head):
# 2*64 + 64*64 + 2*64*32 + 64*64 + 3*64*192 = 49,280; plus embedding and head 2*16*64 and the
# final norm 64.
TINY_PARAMS = 2 * 49_280 + 2 * V * D + D  # 100,672


# LoRA of rank 4 on all seven projections: r x (in + out) each, per layer
# q 4 x (64 + 64) + k, v 4 x (64 + 32) + o 4 x (64 + 64) + gate, up 4 x (64 + 192)
# + down 4 x (192 + 64) = 512 + 2 x 384 + 512 + 3 x 1,024 = 4,864; two layers.
RANK = 4
ADAPTERS = 2 * 4_864  # 9,728 f32 adapter elements, the only trained ones (no value head)


R = 3  # scored slots per row: 3 turns x 1 action slot (`rollout.action_slots`)
KV = 4 * (D + 2 * KV_HEADS * HEAD_DIM) + 8 * KV_HEADS * HEAD_DIM + 8 * D  # last layer, unscored


def _a(keys: int, c: int = 4) -> int:
    """a(keys) of rl4agents/memory.py's docstring, written out for the tiny preset."""
    linear = 4 * D + 3 * HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM + 4 * D_FF  # 1,280
    f32_copies = 8 * (HEADS + KV_HEADS) * HEAD_DIM + 8 * D  # 1,280
    return 4 * linear + f32_copies + (8 + c) * HEADS * keys


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"qkv_bias": True, "qk_norm": True, "tie_embeddings": True, "value_head": "separate"},
        {"value_head": "shared", "param_dtype": "bfloat16"},
        {"lora_rank": 4},
        {"lora_rank": 2, "lora_targets": ("q", "down"), "value_head": "separate", "qkv_bias": True},
    ],
)
def test_param_shapes__match_the_model(overrides):
    cfg = policy.make_config("tiny", V, **overrides)
    _, state = nnx.split(nnx.eval_shape(lambda: policy.Policy(cfg, nnx.Rngs(0))))
    real = sorted(
        (sharding.path_str(path), tuple(leaf.shape))
        for path, leaf in jax.tree_util.tree_leaves_with_path(state)
    )
    assert sorted(memory.param_shapes(cfg)) == real
    assert memory.num_params(cfg) == policy.count_params(state)
    # The trained leaves are those `lora.mask_optimizer` updates (all of them without LoRA).
    trained = sum(math.prod(s) for p, s in memory.param_shapes(cfg) if memory.is_trained(cfg, p))
    assert trained == (lora.count(state)[0] if cfg.lora_rank else policy.count_params(state))


def test_num_params__tiny_real_model_equals_hand_count():
    cfg = policy.make_config("tiny", V)
    model = policy.Policy(cfg, nnx.Rngs(0))
    assert memory.num_params(cfg) == policy.count_params(nnx.state(model)) == TINY_PARAMS


def test_estimate__tiny_terms_by_hand():
    est = memory.estimate(_run(tiny_config()), MESH8)
    assert est.num_params == TINY_PARAMS
    # Replicated state on a data-parallel mesh: params, AdamW mu + nu and the KL reference, f32.
    assert est.term("parameters") == TINY_PARAMS * 4
    assert est.term("optimizer") == 2 * TINY_PARAMS * 4
    assert est.term("reference") == TINY_PARAMS * 4
    assert est.term("episode arrays") == 24 * B * T * 4 // 8
    assert est.phases["rollout"][0].nbytes == LAYERS * 2 * B * T * KV_HEADS * HEAD_DIM * 4 // 8
    # Prefill chunk: the longer of the prompt (21) and an observation (23), and the logits of
    # each row's last token (the prefill computes no others).
    assert est.phases["rollout"][1].nbytes == B * (23 * _a(T) + V * 4) // 8
    # The KL reference pass and the update compute logits at the R action slots alone, and the
    # update's last layer keeps its queries and MLP there only.
    assert est.term("scoring pass") == B * (L * _a(L) + R * 3 * V * 4) // 8
    activations = B * (L * ((LAYERS - 1) * _a(L) + KV + 2 * D * 4) + R * _a(L))
    assert est.term("activations") == activations // 8
    assert est.term("logits") == 3 * B * R * V * 4 // 8
    assert est.phases["update"][0] == memory.Term("gradients", TINY_PARAMS * 4, "1 x parameters")
    # The optimizer step: the gradients, their all-reduced copy and AdamW's new mu and nu.
    assert est.phase_bytes("optimizer step") == 4 * TINY_PARAMS * 4
    resident = 4 * TINY_PARAMS * 4 + 24 * B * T * 4 // 8
    update = TINY_PARAMS * 4 + (activations + 3 * B * R * V * 4) // 8
    assert est.phase_bytes("update") == update
    # At 3 turns of one token the tiny model's activations are smaller than the state.
    assert update < 4 * TINY_PARAMS * 4
    assert est.peak_phase == "optimizer step"
    assert est.peak == resident + 4 * TINY_PARAMS * 4
    assert est.state_fully_sharded == math.ceil(4 * TINY_PARAMS * 4 / 8)


MESH222 = {"data": 2, "fsdp": 2, "tensor": 2}
CRITIC = {"model.value_head": "separate", "credit.name": "ppo_gae", "model.remat": True}
BF16_ECHO = {"model.param_dtype": "bfloat16", "model.dtype": "bfloat16", "loss.echo_coef": 0.1}


@pytest.mark.parametrize(
    "overrides, mesh, peak, resident",
    [
        # Bytes per device the estimate gave before it counted branching, staleness and LoRA;
        # with those off it must give them unchanged. The first is the hand sum of
        # test_estimate__tiny_terms_by_hand: 4 x 402,688 + 8,928 resident + 4 x 402,688.
        ({}, MESH8, 3_230_432, 1_619_680),
        ({}, MESH222, 2_203_008, 424_384),
        ({"rollout.context": "window"}, MESH8, 4_478_144, 1_619_680),
        ({"rollout.context": "window"}, MESH222, 5_437_568, 424_384),
        (CRITIC, MESH8, 6_421_248, 3_215_088),
        (CRITIC, MESH222, 4_050_388, 827_344),
        (BF16_ECHO, MESH8, 2_939_632, 814_304),
        (BF16_ECHO, MESH222, 4_119_904, 221_120),
    ],
)
def test_estimate__knobs_off_keep_the_numbers(overrides, mesh, peak, resident):
    est = memory.estimate(_run(tiny_config(**overrides)), mesh)
    assert (est.peak, est.resident_bytes) == (peak, resident)
    for name in ("stale parameters", "updated parameters", "fork snapshots"):
        assert est.term(name) == 0, name


def _phase_diff(on: memory.Estimate, off: memory.Estimate) -> dict[str, int]:
    return {phase: on.phase_bytes(phase) - off.phase_bytes(phase) for phase in off.phases}


def _phase_term(est: memory.Estimate, phase: str, name: str) -> int:
    return sum(t.nbytes for t in est.phases[phase] if t.name == name)


def test_estimate__lora_counts_adapters_and_the_moments_of_trained_leaves_only():
    off = memory.estimate(_run(tiny_config()), MESH8)
    on = memory.estimate(_run(tiny_config(**{"model.lora.rank": RANK})), MESH8)
    assert on.num_params == TINY_PARAMS + ADAPTERS  # 110,400
    # Replicated on 8 devices: the frozen base and the f32 adapters, AdamW mu + nu of the
    # adapters alone (402,688 + 38,912 B; 77,824 B), the reference copies both.
    assert on.term("parameters") == TINY_PARAMS * 4 + ADAPTERS * 4
    assert on.term("optimizer") == 2 * ADAPTERS * 4
    assert on.term("reference") == (TINY_PARAMS + ADAPTERS) * 4
    # A gradient for every leaf (zeros for the frozen base), then the adapters' all-reduced
    # gradients and new moments.
    assert _phase_term(on, "update", "gradients") == (TINY_PARAMS + ADAPTERS) * 4
    assert on.phase_bytes("optimizer step") == (TINY_PARAMS + ADAPTERS) * 4 + 3 * ADAPTERS * 4
    # Turned on: + 2 x 38,912 (parameters, reference) - 2 x (402,688 - 38,912) (moments)
    # = -649,728 B resident; the gradients grow by the adapters', the optimizer step's three
    # copies shrink from the model's to the adapters'.
    assert (
        on.resident_bytes - off.resident_bytes
        == 2 * ADAPTERS * 4 - 2 * (TINY_PARAMS - ADAPTERS) * 4
    )
    assert on.resident_bytes - off.resident_bytes == -649_728
    assert _phase_diff(on, off) == {
        "rollout": 0,
        "scoring": 0,
        "update": ADAPTERS * 4,
        "optimizer step": ADAPTERS * 4 + 3 * (ADAPTERS - TINY_PARAMS) * 4,
        "evaluation": 0,
    }
    # parameters + reference (2 x 441,600) + moments (77,824) over 8 devices
    assert on.state_fully_sharded == (2 * (TINY_PARAMS + ADAPTERS) * 4 + 2 * ADAPTERS * 4) // 8
    # bf16 base parameters: the adapters (and their moments) stay f32.
    config = tiny_config(**{"model.lora.rank": RANK, "model.param_dtype": "bfloat16"})
    bf16 = memory.estimate(_run(config), MESH8)
    assert bf16.term("parameters") == TINY_PARAMS * 2 + ADAPTERS * 4
    assert bf16.term("optimizer") == 2 * ADAPTERS * 4
    assert "9,728 LoRA adapters (rank 4) x 4 B" in bf16.format()


def test_estimate__staleness_keeps_k_copies_of_the_parameters():
    off = memory.estimate(_run(tiny_config()), MESH8)
    on = memory.estimate(_run(tiny_config(**{"train.staleness": 2})), MESH8)
    # Turned on: 2 x 402,688 B more, resident for the whole run, and the optimizer step holds
    # the updated parameters beside the old ones (which join the ring): 402,688 B more there.
    assert on.term("stale parameters") == 2 * TINY_PARAMS * 4
    assert on.term("updated parameters") == TINY_PARAMS * 4
    assert on.resident_bytes - off.resident_bytes == 2 * TINY_PARAMS * 4 == 805_376
    assert _phase_diff(on, off) == {
        "rollout": 0,
        "scoring": 0,
        "update": 0,
        "optimizer step": TINY_PARAMS * 4,
        "evaluation": 0,
    }
    assert on.peak_phase == off.peak_phase == "optimizer step"
    assert on.peak - off.peak == 3 * TINY_PARAMS * 4 == 1_208_064
    # parameters, reference, two stale copies and two moments, over 8 devices
    assert on.state_fully_sharded == 6 * TINY_PARAMS * 4 // 8
    # The copies are whole parameter trees, split like the parameters: LoRA's frozen base and
    # adapters both, and a quarter each under fsdp = 4 (a few norm scales stay whole).
    config = tiny_config(**{"train.staleness": 1, "model.lora.rank": RANK})
    assert (
        memory.estimate(_run(config), MESH8).term("stale parameters")
        == (TINY_PARAMS + ADAPTERS) * 4
    )
    fsdp = memory.estimate(_run(tiny_config(**{"train.staleness": 2})), {"data": 2, "fsdp": 4})
    assert fsdp.term("stale parameters") == 2 * fsdp.term("parameters") < 2 * TINY_PARAMS * 4


def test_estimate__branching_counts_every_row_and_the_fork_snapshots():
    # Rule "every" on K = 3 turns: M = 3 fork slots per root, N = 2 branches each, so the
    # step holds 8 x (1 + 3 x 2) = 56 rows: 8 roots and 48 branches.
    rows, k = 8 * (1 + 3 * 2), 3
    config = tiny_config(**{"rollout.branch.rule": "every", "rollout.branch.num_branches": 2})
    on = memory.estimate(_run(config), MESH8)
    off = memory.estimate(_run(tiny_config()), MESH8)
    kv_row = LAYERS * 2 * T * KV_HEADS * HEAD_DIM * 4  # one episode's KV cache, 23,808 B
    prefill_row = 23 * _a(T) + V * 4  # logits at the last token only
    scoring_row = L * _a(L) + R * 3 * V * 4
    activations_row = L * ((LAYERS - 1) * _a(L) + KV + 2 * D * 4) + R * _a(L)
    logits_row = 3 * R * V * 4
    assert on.term("episode arrays") == 24 * rows * T * 4 // 8
    assert _phase_term(on, "rollout", "KV cache") == rows * kv_row // 8
    assert _phase_term(on, "rollout", "prefill") == rows * prefill_row // 8
    # the roots' cache at the start of each of the 3 turns
    assert on.term("fork snapshots") == k * 8 * kv_row // 8
    assert on.term("scoring pass") == rows * scoring_row // 8
    assert on.term("activations") == rows * activations_row // 8
    assert on.term("logits") == rows * logits_row // 8
    # Turned on: 48 more rows in every term that counts episodes, plus the snapshots; the
    # state, the optimizer step and evaluation (plain rollouts of eval_tasks) are unchanged.
    assert on.resident_bytes - off.resident_bytes == 24 * (rows - 8) * T * 4 // 8
    assert _phase_diff(on, off) == {
        "rollout": ((rows - 8) * (kv_row + prefill_row) + k * 8 * kv_row) // 8,
        "scoring": (rows - 8) * scoring_row // 8,
        "update": (rows - 8) * (activations_row + logits_row) // 8,
        "optimizer step": 0,
        "evaluation": 0,
    }
    assert "B_root=8 x (1 + M=3 x N=2) = B=56" in on.format()


def test_estimate__nested_forks_count_every_level_and_its_snapshots():
    # Rule "turns" (1, 2) on K = 3 turns, N = 2, two levels: M = 2 fork slots, M x N = 4, so
    # 8 x (1 + 4 + 16) = 168 rows. Snapshots: the roots' 3 turns, and the level-1 rows' turns
    # from k_start = 1 on (2 turns) to fork level 2 from: 3 x 8 + 2 x 32 = 88 rows of cache.
    branch = {
        "rollout.branch.rule": "turns",
        "rollout.branch.turns": (1, 2),
        "rollout.branch.num_branches": 2,
        "rollout.branch.levels": 2,
    }
    on = memory.estimate(_run(tiny_config(**branch)), MESH8)
    kv_row = LAYERS * 2 * T * KV_HEADS * HEAD_DIM * 4
    assert on.term("episode arrays") == 24 * 168 * T * 4 // 8
    assert _phase_term(on, "rollout", "KV cache") == 168 * kv_row // 8
    assert on.term("fork snapshots") == 88 * kv_row // 8
    assert "B_root=8 x (1 + M=2 x N=2 + (M x N)^2) = B=168" in on.format()


def test_estimate__branching_window_rows_are_episodes_times_turns():
    # Rule "turns" at turn 1 with N = 3: M = 1, 8 x (1 + 1 x 3) = 32 episodes; the update
    # trains on 32 x 3 turn rows (24 without branching), and no cache is kept to fork from.
    window = {"rollout.context": "window"}
    branch = {"rollout.branch.rule": "turns", "rollout.branch.turns": (1,)}
    branch["rollout.branch.num_branches"] = 3
    off = memory.estimate(_run(tiny_config(**window)), MESH8)
    on = memory.estimate(_run(tiny_config(**window, **branch)), MESH8)
    assert on.term("fork snapshots") == 0
    for name in ("episode arrays", "scoring pass", "activations", "logits"):
        assert on.term(name) == 4 * off.term(name), name
    assert _phase_term(on, "rollout", "KV cache") == 4 * _phase_term(off, "rollout", "KV cache")
    assert "N=96 x" in on.format()


def test_estimate__logit_chunk_keeps_one_block_of_slots_live():
    # ECHO scores all T slots (observations too), so a chunk of 16 < T leaves 16 live (and a
    # chunk >= T, all T).
    config = tiny_config(**{"loss.echo_coef": 0.1, "loss.kl_coef": 0.1, "model.logit_chunk": 16})
    est = memory.estimate(_run(config), MESH8)
    assert est.term("logits") == 3 * B * 16 * V * 4 // 8
    assert est.term("scoring pass") == B * (T * _a(T) + 16 * 3 * V * 4) // 8
    assert "chunk 16 of R=93" in next(t.formula for t in est.phases["update"] if t.name == "logits")
    config = tiny_config(**{"loss.echo_coef": 0.1, "model.logit_chunk": 500})
    assert memory.estimate(_run(config), MESH8).term("logits") == 3 * B * T * V * 4 // 8


def test_estimate__remat_keeps_layer_inputs_and_one_layer():
    config = tiny_config(**{"model.remat": True, "model.dtype": "bfloat16"})
    est = memory.estimate(_run(config), MESH8)
    assert est.term("activations") == B * L * ((LAYERS + 2) * D * 2 + _a(L, c=2)) // 8
    no_remat = memory.estimate(_run(config), MESH8, remat=False)
    assert est.term("activations") < no_remat.term("activations")


def test_estimate__state_per_device_matches_the_real_shardings():
    # Exact: the estimate's per-device state equals the shard shapes the experiment places.
    config = tiny_config(**{"model.value_head": "shared", "credit.name": "ppo_gae"})
    devices = jax.devices()
    for shape in ((8, 1, 1), (2, 2, 2), (1, 4, 2)):
        mesh = sharding.make_mesh(("data", "fsdp", "tensor"), shape, devices=devices)
        exp = experiment.build(config, mesh=mesh)
        real = sum(
            math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
            for leaf in jax.tree.leaves(exp.abstract_state())
            if leaf.ndim  # the step and Adam's count are scalars
        )
        est = memory.estimate(exp, dict(mesh.shape))
        assert est.term("parameters") + est.term("optimizer") + est.term("reference") == real
    # LoRA (the moments of the adapters and value head only) and two stale copies; the
    # estimate of the built experiment (its StepConfig's knobs) equals that of the config.
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (2, 2, 2), devices=devices)
    for overrides in ({"model.lora.rank": RANK}, {"train.staleness": 2}):
        knobs = tiny_config(**{"model.value_head": "shared", "credit.name": "ppo_gae", **overrides})
        exp = experiment.build(knobs, mesh=mesh)
        real = sum(
            math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
            for leaf in jax.tree.leaves(exp.abstract_state())
            if leaf.ndim
        )
        est = memory.estimate(exp, dict(mesh.shape))
        state = ("parameters", "optimizer", "reference", "stale parameters")
        assert sum(est.term(name) for name in state) == real, overrides
        assert est.format() == memory.estimate(_run(knobs), dict(mesh.shape)).format()
    # bf16 parameters: AdamW's moments stay bf16 (optax's default; no f32 master copy).
    exp = experiment.build(tiny_config(**{"model.param_dtype": "bfloat16"}), mesh=mesh)
    moments = [x for x in jax.tree.leaves(exp.abstract_state().opt_state) if x.ndim]
    assert {x.dtype for x in moments} == {jax.numpy.dtype("bfloat16")}
    assert sum(x.size * 2 for x in moments) == 2 * memory.num_params(exp.model_cfg) * 2


@pytest.mark.parametrize(
    "preset, vocab, published",
    [
        # Parameter counts of the Hugging Face checkpoints (safetensors totals).
        ("qwen2_0.5b", 151_936, 494_032_768),
        ("qwen2_1.5b", 151_936, 1_543_714_304),
        ("qwen2_7b", 152_064, 7_615_616_512),
    ],
)
def test_num_params__presets_match_published_counts(preset, vocab, published):
    assert memory.num_params(policy.make_config(preset, vocab)) == published


def test_estimate__fsdp_splits_a_7b_state_and_data_parallel_replicates_it():
    config = tiny_config(**{"model.preset": "qwen2_7b"})
    n = memory.estimate(_run(config), MESH8, vocab_size=152_064).num_params
    assert n == 7_615_616_512  # Qwen2.5-7B with its 152,064-token vocabulary (as above)
    dp = memory.estimate(_run(config), MESH8, vocab_size=152_064)
    fsdp = memory.estimate(_run(config), {"data": 1, "fsdp": 8, "tensor": 1}, vocab_size=152_064)
    assert dp.term("parameters") == n * 4
    # Only the norm scales and q/k/v biases (a few 1e5 elements) stay whole under FSDP.
    np.testing.assert_allclose(fsdp.term("parameters"), n * 4 / 8, rtol=1e-3)
    assert fsdp.state_fully_sharded == dp.state_fully_sharded


@pytest.mark.parametrize(
    "overrides",
    [
        {"rollout.max_turns": 1},
        {"rollout.max_turns": 8},
        # XLA keeps a whole tree of (zero) gradients under LoRA: 1,618,048 against 1,605,084 B
        {"rollout.max_turns": 1, "model.lora.rank": RANK},
        # and the updated parameters beside the stale ring: 4,433,888 against 4,083,940 B
        {"rollout.max_turns": 1, "train.staleness": 2},
        # 8 x (1 + 8 x 1) = 72 rows of 8 turns, the update the peak: 32,932,256 against
        # 24,723,688 B (a larger program: slow)
        pytest.param(
            {
                "rollout.max_turns": 8,
                "rollout.branch.rule": "every",
                "rollout.branch.num_branches": 1,
            },
            marks=pytest.mark.slow,
        ),
    ],
)
def test_estimate__bounds_xla_memory_analysis(overrides):
    # The compiled train step's own figure (arguments + outputs - donated + temporaries) on
    # 8 devices, data parallel: the estimate errs high (scripts/memory_table.py's check). At
    # one turn the activations are small and the optimizer step is the peak (4 x parameters).
    config = tiny_config(**overrides)
    exp = experiment.build(config)
    ma = exp.train_step.lower(exp.abstract_state(), exp.root_key()).compile().memory_analysis()
    xla = (
        ma.argument_size_in_bytes
        + ma.output_size_in_bytes
        - ma.alias_size_in_bytes
        + ma.temp_size_in_bytes
    )
    est = memory.estimate(exp, dict(exp.mesh.shape))
    assert xla <= est.peak <= 1.5 * xla, (est.peak, xla)


def test_check_fits__refuses_with_the_numbers():
    config = tiny_config()
    est = memory.estimate(_run(config), MESH8)
    with pytest.raises(ValueError) as info:
        memory.check_fits(_run(config), 8, 1 << 20)  # 1 MiB per device
    msg = str(info.value)
    assert f"estimated peak {memory.format_bytes(est.peak)} per device > 1.00 MiB" in msg
    assert "100,672 parameters" in msg
    size = re.escape(memory.format_bytes(TINY_PARAMS * 4))  # 393.25 KiB
    assert re.search(rf"parameters +{size} +100,672 x 4 B \(float32\)", msg)
    assert "activations" in msg and "<- peak" in msg and "fsdp" in msg


def test_check_fits__a_config_that_fits_passes():
    config = tiny_config()
    est = memory.check_fits(_run(config), 8, 80 * memory.GIB)
    assert est.capacity == 80 * memory.GIB and est.peak < est.capacity
    assert memory.check_fits(_run(config), 8, None).capacity is None  # unknown memory: no check


def test_loop__refuses_before_allocating(tmp_path):
    config = tiny_config(**{"mesh.device_memory_gb": 1e-4})  # about 100 KiB
    with pytest.raises(ValueError, match=r"does not fit: estimated peak .* > 104.86 KiB"):
        loop.run(config, str(tmp_path), quiet=True)
    assert not (tmp_path / "checkpoints").exists()


def test_device_memory__cpu_devices_share_the_host_ram():
    import os

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory.device_memory(tiny_config()) == ram // len(jax.local_devices())
    assert memory.device_memory(tiny_config(**{"mesh.device_memory_gb": 2.0})) == 2 * memory.GIB
