"""A pretrained chat model as the policy of an environment, trained with LoRA.

  python scripts/get_model.py smollm2-135m-instruct --out=runs/models/smollm2-135m-instruct
  python scripts/train.py --config=configs/real_model.py:guess_number --workdir=runs/gn_smollm2
  python scripts/train.py --config=configs/real_model.py:frozen_lake,rloo \
      --config.model.checkpoint=DIR --workdir=runs/fl_mine

The argument is an environment name (default guess_number), optionally followed by a comma
and a critic-free credit variant (default grpo). The environment keeps its own config
(`configs/<env>.py`: settings, turns); on top of it:

- the policy is the checkpoint folder `model.checkpoint` (default: SmolLM2-135M-Instruct where
  `scripts/get_model.py` writes it), with its tokenizer and chat template framing the
  episodes (`env.vocab="builtin"` defers to the checkpoint's tokenizer);
- each episode opens with the environment's instruction as the system message
  (`model.system_prompt="auto"`), as in `scripts/zero_shot.py`;
- LoRA of rank 16 (alpha 32) on every projection, float32 master weights, at learning rate
  1e-4 (docs/real_model.md, "LoRA"), and rematerialised layers in the update;
- replies of up to 16 tokens (`rollout.max_action_len`): a chat model writes "The number is
  32." where the built-in vocabulary's policy writes two tokens;
- 4 tasks x 8 samples a step and 128 held-out evaluation tasks every 10 steps: a 135M-parameter
  model on the 2-core CPU takes minutes per step, not seconds.
"""

from __future__ import annotations

import importlib

MODEL_DIR = "runs/models/smollm2-135m-instruct"


def get_config(arg: str | None = None):
    name, _, variant = (arg or "guess_number").partition(",")
    c = importlib.import_module(f"configs.{name}").get_config(variant or "grpo")
    c.unlock()
    if c.model.value_head != "none":
        raise ValueError(
            f"configs/real_model.py:{arg}: credit variant {variant!r} needs a value head; "
            "allowed: a critic-free variant (the pretrained checkpoint has no value head)"
        )
    c.model.checkpoint = MODEL_DIR
    c.env.vocab = "builtin"  # the checkpoint's tokenizer (resolve.make_env)
    c.model.system_prompt = "auto"
    c.model.lora.rank = 16
    c.model.lora.alpha = 32.0
    # Without rematerialisation the update of 32 episodes of a 30-layer model keeps about
    # 15 GiB of activations (the start-up memory estimate refuses it); with it, one layer's.
    c.model.remat = True
    # Unrolled, the train step of 30 layers takes over 15 minutes to compile on the 2-core CPU.
    c.model.scan_layers = True
    c.rollout.max_action_len = max(16, c.rollout.max_action_len)
    c.rollout.num_tasks = 4
    c.rollout.group_size = 8
    c.train.minibatches = 1
    c.optim.lr = 1e-4
    c.loss.entropy_coef = 0.0
    c.train.eval_tasks = 128
    c.train.eval_every = 10
    c.train.max_minutes = 60.0
    c.lock()
    return c
