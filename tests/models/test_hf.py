"""Hugging Face checkpoints: tiny random Llama / Qwen2 / Qwen3 built with `transformers` locally
(no downloads), loaded into rl4agents, compared on logits and greedy continuations, exported
back and reloaded by `transformers`; the local tokenizer.json wrapper drives an environment."""

import dataclasses
import functools
import importlib
import importlib.util
import json
import os
import shutil

import pytest

_NEEDS = ("torch", "transformers", "tokenizers", "safetensors")
_MISSING = [name for name in _NEEDS if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"not installed: {_MISSING}")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class _Lazy:
    """A module imported on first use: `torch` and `transformers` take seconds to import, which
    every test worker would pay while collecting the suite, not only the one that runs these."""

    def __init__(self, name):
        self._name = name
        self._module = None

    def __getattr__(self, attr):
        if attr.startswith("_"):
            # pytest's collection probes every module attribute for private names (`_mock_name`,
            # fixture markers); answering them would import the module on every worker.
            raise AttributeError(attr)
        if self._module is None:
            self._module = importlib.import_module(self._name)
            if self._name == "transformers":
                self._module.logging.set_verbosity_error()
        return getattr(self._module, attr)


torch = _Lazy("torch")
transformers = _Lazy("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from rl4agents import envs, sharding  # noqa: E402
from rl4agents.models import hf, hf_tokenizer  # noqa: E402
from tests.hf_fixtures import write_chatml_tokenizer  # noqa: E402

ARCHS = ("llama", "qwen2", "qwen3")
B, S, NEW = 2, 12, 8


def _tiny_hf_model(arch, vocab_size=128, seed=0):
    """A random 2-layer model; norms and biases perturbed so their loading is checked."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        initializer_range=0.1,  # peaked logits: greedy ties are unlikely
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if arch == "llama":  # Llama 3 RoPE scaling, reaching these short positions
        rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
        config = transformers.LlamaConfig(
            **common,
            rope_theta=500000.0,
            rope_scaling={**rope, "original_max_position_embeddings": 64},
        )
        model = transformers.LlamaForCausalLM(config)
    elif arch == "qwen2":  # q/k/v biases, tied embeddings
        config = transformers.Qwen2Config(**{**common, "tie_word_embeddings": True}, rope_theta=1e6)
        model = transformers.Qwen2ForCausalLM(config)
    else:  # q/k norms, head_dim != hidden_size / heads
        config = transformers.Qwen3Config(**common, head_dim=32, rope_theta=1e6)
        model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def _prompt(vocab_size=128):
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab_size, (B, S), generator=gen)


@functools.partial(jax.jit, static_argnums=0)
def _jit_forward(graphdef, state, tokens):
    b, s = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(s), (b, s))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((s, s), bool)), (b, s, s))
    return nnx.merge(graphdef, state)(tokens, positions, mask).logits


def _forward(policy, tokens):
    """f32[B, S, V] logits of a full causal forward over int32[B, S] tokens."""
    graphdef, state = nnx.split(policy)
    return np.asarray(_jit_forward(graphdef, state, jnp.asarray(tokens, jnp.int32)))


def _params(policy):
    return nnx.state(policy, nnx.Param)


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens))).logits.float().numpy()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """arch -> (folder, reference logits f32[B, S, V], HF greedy continuation int[B, NEW])."""
    out = {}
    prompt = _prompt()
    for arch in ARCHS:
        model = _tiny_hf_model(arch)
        folder = tmp_path_factory.mktemp(arch)
        # Qwen3 goes through shards + model.safetensors.index.json.
        shard = dict(max_shard_size="40KB") if arch == "qwen3" else {}
        model.save_pretrained(folder, safe_serialization=True, **shard)
        with torch.no_grad():
            greedy = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=NEW,
                do_sample=False,
                pad_token_id=0,
            )[:, S:]
        out[arch] = (str(folder), _hf_logits(model, prompt), greedy.numpy())
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_load_pretrained__f32_logits_greedy_and_export_match_transformers(arch, saved, tmp_path):
    folder, ref, ref_greedy = saved[arch]
    if arch == "qwen3":
        assert os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
    policy, cfg = hf.load_pretrained(folder, "float32")
    assert cfg.qkv_bias == (arch == "qwen2") and cfg.qk_norm == (arch == "qwen3")
    assert cfg.tie_embeddings == (arch == "qwen2")
    assert cfg.head_dim == (32 if arch == "qwen3" else 16)
    assert (cfg.rope_scaling is not None) == (arch == "llama")
    prompt = _prompt()
    logits = _forward(policy, prompt.numpy())
    assert np.abs(logits - ref).max() < 1e-4  # f32 parity
    greedy = np.asarray(hf.greedy_generate(policy, prompt.numpy(), NEW))
    np.testing.assert_array_equal(greedy, ref_greedy)

    out = hf.export_pretrained(policy, cfg, tmp_path / "export")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == hf.SUPPORTED[arch]
    assert np.abs(_hf_logits(reloaded, prompt) - ref).max() < 1e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_load_pretrained__bf16_close_to_transformers(arch, saved):
    folder, ref, _ = saved[arch]
    policy, cfg = hf.load_pretrained(folder, "bfloat16")
    leaves = jax.tree.leaves(jax.tree.map(lambda x: x.dtype, _params(policy)))
    assert cfg.param_dtype == cfg.dtype == "bfloat16" and set(leaves) == {jnp.dtype(jnp.bfloat16)}
    logits = _forward(policy, _prompt().numpy())
    assert logits.dtype == np.float32
    # bf16 tolerance: logits span about +-3; transformers' own bf16 run differs by ~5e-2.
    assert np.abs(logits - ref).max() < 0.15


@functools.partial(jax.jit, static_argnums=0)
def _jit_log_probs(graphdef, state, tokens):
    """f32[B, S-1] log p(tokens[:, 1:]) and entropy: the policy's `log_probs` of its own
    next-token predictions (`cfg.logit_chunk` slots at a time)."""
    policy = nnx.merge(graphdef, state)
    b, s = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(s - 1), (b, s - 1))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((s - 1, s - 1), bool)), (b, s - 1, s - 1))
    hidden = policy.features(tokens[:, :-1], positions, mask).hidden
    return policy.log_probs(hidden, tokens[:, 1:])


def test_load_pretrained__logit_chunk_is_a_runtime_field_and_keeps_log_probs(saved):
    folder, ref, _ = saved["qwen2"]  # tied head: the chunked head reads the embedding
    tokens = _prompt().numpy()
    whole, cfg_whole = hf.load_pretrained(folder)
    chunked, cfg = hf.load_pretrained(folder, logit_chunk=5)  # 5 does not divide S - 1 = 11
    assert "logit_chunk" in hf.RUNTIME_FIELDS
    assert cfg.logit_chunk == 5 and cfg_whole.logit_chunk == 0
    assert dataclasses.replace(cfg, logit_chunk=0) == cfg_whole
    got = [
        [np.asarray(x) for x in _jit_log_probs(*nnx.split(p), jnp.asarray(tokens))]
        for p in (whole, chunked)
    ]
    (logp_whole, ent_whole), (logp, ent) = got
    np.testing.assert_allclose(logp, logp_whole, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ent, ent_whole, rtol=1e-6, atol=1e-6)
    # Independent reference: float64 log-softmax of transformers' logits at the targets.
    z = ref[:, :-1].astype(np.float64)
    logp_all = z - z.max(-1, keepdims=True)
    logp_all -= np.log(np.exp(logp_all).sum(-1, keepdims=True))
    want = np.take_along_axis(logp_all, tokens[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(logp, want, atol=2e-4)  # f32 parity, as for the logits
    np.testing.assert_allclose(ent, -(np.exp(logp_all) * logp_all).sum(-1), atol=2e-4)


def test_load_pretrained__places_params_on_mesh_and_value_heads(saved):
    folder, ref, _ = saved["qwen2"]
    mesh = sharding.make_mesh(("data",), (-1,))
    vocab_sharded = NamedSharding(mesh, P("data", None))

    def place(path, shape):
        return vocab_sharded if path == "model.embed.embedding" else sharding.replicated(mesh)

    policy, cfg = hf.load_pretrained(folder, mesh=mesh, shardings=place, value_head="shared")
    state = _params(policy)
    assert state["model"]["embed"]["embedding"][...].sharding == vocab_sharded
    q_kernel = state["model"]["layers"][0]["attn"]["q_proj"]["kernel"][...]
    assert q_kernel.sharding.is_fully_replicated and q_kernel.sharding.mesh == mesh
    assert np.abs(_forward(policy, _prompt().numpy()) - ref).max() < 1e-4
    assert not np.any(np.asarray(state["value_proj"]["kernel"][...]))  # value head starts at 0

    separate, _ = hf.load_pretrained(folder, value_head="separate")
    s = _params(separate)
    np.testing.assert_array_equal(
        np.asarray(s["critic"]["layers"][1]["mlp"]["up_proj"]["kernel"][...]),
        np.asarray(s["model"]["layers"][1]["mlp"]["up_proj"]["kernel"][...]),
    )
    with pytest.raises(ValueError, match=r"cannot override \['d_model'\]"):
        hf.load_pretrained(folder, d_model=32)


def test_load_pretrained__default_placement_follows_the_training_rules(saved):
    folder, ref, _ = saved["qwen3"]
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (2, 2, 2))
    policy, _ = hf.load_pretrained(folder, mesh=mesh)
    state = nnx.split(policy)[1]
    want = sharding.tree_shardings(state, mesh)
    got = jax.tree.map(lambda x: x.sharding, state)
    assert jax.tree.leaves(got) == jax.tree.leaves(want)
    q = state["model"]["layers"][0]["attn"]["q_proj"]["kernel"][...]
    assert q.sharding.spec == P("fsdp", "tensor")
    assert np.abs(_forward(policy, _prompt().numpy()) - ref).max() < 1e-4


def _copy(folder, tmp_path, edit_config=None, edit_tensors=None):
    dst = tmp_path / "edited"
    shutil.copytree(folder, dst)
    if edit_config:
        config = json.loads((dst / "config.json").read_text())
        edit_config(config)
        (dst / "config.json").write_text(json.dumps(config))
    if edit_tensors:
        from safetensors.numpy import load_file, save_file

        tensors = load_file(dst / "model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_load_pretrained__errors_name_the_field_or_tensor(saved, tmp_path):
    folder = saved["llama"][0]

    def mistral(c):
        c.update(model_type="mistral", architectures=["MistralForCausalLM"])

    with pytest.raises(
        ValueError, match=r"model_type='mistral' is not supported; supported.*qwen3"
    ):
        hf.load_pretrained(_copy(folder, tmp_path / "a", mistral))

    def classifier(c):
        c["architectures"] = ["LlamaForSequenceClassification"]

    with pytest.raises(ValueError, match=r"architectures=\['LlamaForSequenceClassification'\]"):
        hf.load_pretrained(_copy(folder, tmp_path / "b", classifier))

    def drop(t):
        del t["model.layers.1.self_attn.k_proj.weight"]

    with pytest.raises(
        ValueError, match=r"missing tensor 'model.layers.1.self_attn.k_proj.weight'"
    ):
        hf.load_pretrained(_copy(folder, tmp_path / "c", edit_tensors=drop))

    def misshape(t):
        t["model.layers.0.mlp.up_proj.weight"] = np.zeros((64, 128), np.float32)

    with pytest.raises(
        ValueError,
        match=r"'model.layers.0.mlp.up_proj.weight' has shape \(64, 128\); expected \(128, 64\)",
    ):
        hf.load_pretrained(_copy(folder, tmp_path / "d", edit_tensors=misshape))

    def smaller_vocab(c):
        c["vocab_size"] = 100

    with pytest.raises(
        ValueError, match=r"'model.embed_tokens.weight' has shape \(128, 64\); expected \(100, 64\)"
    ):
        hf.load_pretrained(_copy(folder, tmp_path / "e", smaller_vocab))

    def bad_eos(c):
        c["eos_token_id"] = 128

    with pytest.raises(ValueError, match=r"eos_token_id=128 does not fit .*vocab_size=128"):
        hf.load_pretrained(_copy(folder, tmp_path / "f", bad_eos))

    def yarn(c):
        c["rope_parameters"]["rope_type"] = "yarn"

    with pytest.raises(ValueError, match=r"rope_parameters.rope_type='yarn' is not supported"):
        hf.load_pretrained(_copy(folder, tmp_path / "g", yarn))

    def extra(t):
        t["model.layers.0.mlp.gate_proj.bias"] = np.zeros((128,), np.float32)

    with pytest.raises(ValueError, match=r"unexpected tensor 'model.layers.0.mlp.gate_proj.bias'"):
        hf.load_pretrained(_copy(folder, tmp_path / "h", edit_tensors=extra))


def test_export_pretrained__rejects_configs_without_hf_architecture():
    from rl4agents.models import policy as policy_lib

    cfg = policy_lib.make_config("tiny", 50, qkv_bias=True, qk_norm=True)
    with pytest.raises(ValueError, match="qkv_bias=True with model.qk_norm=True"):
        hf.config_to_hf(cfg)
    with pytest.raises(ValueError, match="model_type='qwen3' does not fit"):
        hf.config_to_hf(policy_lib.make_config("tiny", 50), "qwen3")


def _write_tokenizer(folder, corpus_extra=(), vocab_size=300, config=None):
    """A byte-level BPE trained on environment words, ChatML specials, a ChatML template."""
    corpus = ["up down left right invalid action\n", "_ O G P #\n_ _ _ G\n", *corpus_extra] * 20
    write_chatml_tokenizer(folder, corpus, vocab_size, bos_token=None, config=config)
    return folder


def test_hf_tokenizer__protocol_chat_template_and_transformers_agree(tmp_path):
    folder = _write_tokenizer(tmp_path / "tok", config={"vocab_size": 320, "bos_token_id": 0})
    tok = hf_tokenizer.HFTokenizer(folder)
    assert tok.vocab_size == 320 and tok.tokenizer_size <= 300
    assert (tok.pad_id, tok.bos_id, tok.eoa_id) == (0, 0, 2)  # bos from config.json
    text = "_ _ G\nup"
    assert tok.decode(tok.encode(text)) == text
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok.encode(text) == reference.encode(text, add_special_tokens=False)
    messages = [{"role": "user", "content": "go left"}, {"role": "assistant", "content": "left"}]
    for gen in (False, True):
        ours = tok.apply_chat_template(messages, add_generation_prompt=gen)
        theirs = reference.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
        assert ours == theirs
    ids = tok.apply_chat_template(messages, tokenize=True)
    assert ids[0] == tok.token_id("<|im_start|>") and tok.eoa_id in ids


def test_hf_tokenizer__fallbacks_and_errors(tmp_path):
    folder = _write_tokenizer(tmp_path / "tok")
    os.remove(os.path.join(folder, "tokenizer_config.json"))
    with pytest.raises(ValueError, match="no end-of-action token"):
        hf_tokenizer.HFTokenizer(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"eos_token_id": [2, 0]}, f)
    tok = hf_tokenizer.HFTokenizer(folder)
    assert tok.eoa_id == tok.pad_id == tok.bos_id == 2 and tok.chat_template is None
    with pytest.raises(ValueError, match="has no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"vocab_size": 128, "eos_token_id": 2}, f)  # the tokenizer has ~300 tokens
    with pytest.raises(ValueError, match=r"config.json vocab_size=128; vocab_size must be"):
        hf_tokenizer.HFTokenizer(folder)
    with pytest.raises(ValueError, match=r"the vocab_size argument=64"):
        hf_tokenizer.HFTokenizer(folder, vocab_size=64)


def test_hf_tokenizer__frozen_lake_runs_with_real_vocabulary_and_loaded_model(tmp_path):
    folder = _write_tokenizer(tmp_path / "m", vocab_size=300)
    tok = hf_tokenizer.HFTokenizer(folder)
    model = _tiny_hf_model("qwen2", vocab_size=320)
    model.save_pretrained(folder, safe_serialization=True)
    policy, cfg = hf.load_pretrained(folder)  # checks the tokenizer fits vocab_size
    assert cfg.vocab_size == hf_tokenizer.HFTokenizer(folder).vocab_size == 320

    env = envs.make("frozen_lake", tokenizer=tok)
    params = env.default_params("train")
    state, ts = jax.jit(env.reset)(jax.random.key(0), params)
    obs = np.asarray(ts.obs_tokens)[: int(ts.obs_len)]
    assert obs.max() < tok.tokenizer_size and "P" in tok.decode(obs)
    action = np.full((env.max_action_len,), tok.pad_id, np.int32)
    right = tok.encode("right")
    action[: len(right)] = right
    _, ts2 = jax.jit(env.step)(jax.random.key(1), state, action, len(right), params)
    assert bool(ts2.valid_action) and "P" in tok.decode(np.asarray(ts2.obs_tokens))

    # The loaded policy reads the environment's prompt (BOS + observation) like transformers.
    prompt = np.concatenate([[tok.bos_id], obs])[None].astype(np.int32)
    ours = np.asarray(hf.greedy_generate(policy, prompt, 4))
    with torch.no_grad():
        theirs = model.generate(
            torch.as_tensor(prompt, dtype=torch.long), max_new_tokens=4, do_sample=False
        )[:, prompt.shape[1] :]
    np.testing.assert_array_equal(ours, theirs.numpy())

    small = _copy(folder, tmp_path / "v", lambda c: c.update(vocab_size=128))
    with pytest.raises(ValueError, match=r"config.json vocab_size=128"):
        hf.load_pretrained(small)


def test_config_from_hf__legacy_rope_keys_defaults_and_sliding_window():
    legacy = {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,  # no num_key_value_heads (MHA), no head_dim
        "rope_theta": 500000.0,
        "rope_scaling": {
            "type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    cfg = hf.config_from_hf(legacy, dtype="bfloat16", value_head="shared")
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta) == (8, 8, 500000.0)
    assert cfg.rope_scaling == (32.0, 1.0, 4.0, 8192.0) and cfg.param_dtype == "bfloat16"
    assert not cfg.tie_embeddings and cfg.value_head == "shared"
    assert hf.config_to_hf(cfg)["rope_scaling"]["original_max_position_embeddings"] == 8192
    qwen2 = {**legacy, "model_type": "qwen2", "rope_scaling": None, "use_sliding_window": True}
    qwen2.update(sliding_window=4096, max_window_layers=1)
    with pytest.raises(ValueError, match="use_sliding_window=true"):
        hf.config_from_hf(qwen2)
    assert hf.config_from_hf({**qwen2, "max_window_layers": 2}).qkv_bias  # no layer slides
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        hf.config_from_hf({**legacy, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="attention_bias=true"):
        hf.config_from_hf({**legacy, "attention_bias": True})


# ~65 s (an RL run from a saved checkpoint): slow suite; loading, parity, placement and the
# checkpoint's tokenizer on a rollout stay in the default suite above
@pytest.mark.slow
def test_train_from_checkpoint__rl_starts_from_the_pretrained_weights(tmp_path):
    from configs import base
    from rl4agents.train import experiment, loop

    folder = _write_tokenizer(tmp_path / "m", vocab_size=300)
    model = _tiny_hf_model("qwen2", vocab_size=320)
    model.save_pretrained(folder, safe_serialization=True)

    def config(**overrides):
        c = base.get_config()
        c.unlock()
        c.model.checkpoint = str(folder)
        c.env.name = "frozen_lake"
        c.rollout.num_tasks, c.rollout.group_size, c.rollout.max_turns = 4, 2, 2
        c.rollout.max_action_len = 3
        c.train.num_steps, c.train.eval_tasks, c.train.eval_every = 1, 8, 1
        c.log.progress = False
        for key, value in overrides.items():
            section, field = key.split(".")
            c[section][field] = value
        c.lock()
        return c

    exp = experiment.build(config())
    assert isinstance(exp.env.tokenizer, hf_tokenizer.HFTokenizer)
    assert exp.model_cfg.vocab_size == 320 and exp.model_cfg.qkv_bias
    params = exp.pretrained_params()
    loaded = nnx.split(hf.load_pretrained(folder)[0])[1]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), jax.device_get(loaded))
    summary = loop.run(config(), str(tmp_path / "run"), quiet=True)
    assert summary["finished"] and summary["steps"] == 1
    with pytest.raises(ValueError, match=r"model.d_model=32 conflicts with model.checkpoint"):
        experiment.build(config(**{"model.d_model": 32}))
    with pytest.raises(ValueError, match=r"env.vocab='minimal' with model.checkpoint"):
        experiment.build(config(**{"env.vocab": "minimal"}))
    # Host (Python) environments speak through the checkpoint's tokenizer too.
    host = config(**{"env.name": "host"})
    with host.unlocked():
        host.env.host.factory = "tests.train.test_host_loop:count_factory"
        host.env.host.max_prompt_len, host.env.host.max_obs_len = 16, 8
    exp = experiment.build(host)
    assert isinstance(exp.env.tokenizer, hf_tokenizer.HFTokenizer)
    summary = loop.run(host, str(tmp_path / "host_run"), quiet=True)
    assert summary["finished"] and summary["steps"] == 1
