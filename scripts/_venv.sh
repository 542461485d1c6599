# Sourced by quickstart.sh and test.sh: make .venv beside the repo if absent and install.
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# EXTRAS: test.sh adds "hf,host" so the checkpoint-parity and TextArena tests run.
.venv/bin/python -m pip install -q -e ".[dev${EXTRAS:+,$EXTRAS}]"
