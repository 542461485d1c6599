#!/bin/bash
# SmolLM2-135M-Instruct speed on a 2-core AVX2-only CPU: ours against PyTorch and TRL, on one
# and on two XLA CPU devices, plus where our GRPO step's time goes. Run from the repository
# root with a Python that has trl (see docs/real_model.md) as TRL_PY, on a quiet machine.
set -euo pipefail
M=runs/models/smollm2-135m-instruct
O=experiments/results/real_model/bench_avx2
TRL_PY=${TRL_PY:-runs/peers/trl/bin/python}
# float32, two devices (the scripts' default on 2 cores) and one device
$TRL_PY scripts/bench.py --real-model=$M --real-dtypes=float32 --repeats 5 \
    --json $O/bench_2dev_f32.json > $O/bench_2dev_f32.txt 2>&1
XLA_FLAGS=--xla_force_host_platform_device_count=1 $TRL_PY scripts/bench.py --real-model=$M \
    --real-dtypes=float32 --repeats 5 --json $O/bench_1dev_f32.json > $O/bench_1dev_f32.txt 2>&1
# bf16 (no native bf16 units on this CPU), one device, ours and PyTorch only, one round
XLA_FLAGS=--xla_force_host_platform_device_count=1 python scripts/bench.py --real-model=$M \
    --real-dtypes=bfloat16 --repeats 1 --json $O/bench_1dev_bf16.json > $O/bench_1dev_bf16.txt 2>&1
# where the step's device time goes
python scripts/profile_ops.py real_update --model=$M --calls 2 --top 15 > $O/profile_2dev.txt 2>&1
XLA_FLAGS=--xla_force_host_platform_device_count=1 python scripts/profile_ops.py real_update \
    --model=$M --calls 2 --top 15 > $O/profile_1dev.txt 2>&1
