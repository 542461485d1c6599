import copy
import os
import sys
import tempfile
import time

sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
import torch
import transformers
from benchlib import real_model as rm

folder = "runs/models/smollm2-135m-instruct"
torch.set_num_threads(2)
sizes = rm.Sizes()
tok = transformers.AutoTokenizer.from_pretrained(folder)
prompts = rm.chat_prompts(tok, sizes.prompts, sizes.prompt_len)
batch = rm.grpo_batch(tok, prompts, sizes.group, sizes.new_tokens)
import jax.numpy as jnp  # noqa: E402

model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
tb = rm.torch_batch(batch)
with torch.no_grad():
    lp = rm.torch_completion_logp(model, tb).numpy()
batch = rm.with_old_logp(batch, jnp.asarray(lp))
tb = rm.torch_batch(batch)
train = copy.deepcopy(model).train()
opt = torch.optim.AdamW(train.parameters(), lr=1e-6)


def state():
    return dict(
        threads=torch.get_num_threads(),
        det=torch.are_deterministic_algorithms_enabled(),
        anomaly=torch.is_anomaly_enabled(),
        grad=torch.is_grad_enabled(),
        mm=torch.get_float32_matmul_precision(),
        interop=torch.get_num_interop_threads(),
        mkldnn=torch.backends.mkldnn.enabled,
        omp=os.environ.get("OMP_NUM_THREADS"),
    )


def t_step(dtype):
    t = time.perf_counter()
    rm.torch_grpo_step(train, opt, tb, dtype)
    return time.perf_counter() - t


print("before", state(), flush=True)
for d in ("float32", "bfloat16"):
    print(d, [round(t_step(d), 2) for _ in range(2)], flush=True)
tr = rm.trl_trainer(copy.deepcopy(model), tok, sizes, tempfile.mkdtemp())
print("after trainer", state(), flush=True)
for d in ("float32", "bfloat16"):
    print(d, [round(t_step(d), 2) for _ in range(2)], flush=True)
inputs = rm.trl_inputs(tb, sizes.prompt_len)
print(
    "trl f32",
    [
        round(
            (lambda t: (rm.trl_grpo_step(tr, inputs, "float32"), time.perf_counter() - t)[1])(
                time.perf_counter()
            ),
            2,
        )
        for _ in range(2)
    ],
    flush=True,
)
print("after trl step", state(), flush=True)
print("torch f32", [round(t_step("float32"), 2) for _ in range(2)], flush=True)
