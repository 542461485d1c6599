# Sourced by quickstart.sh and test.sh: make .venv beside the repo if absent and install the
# package (editable) with its "dev" extra and the extras in EXTRAS (test.sh: "hf,host").
#
# Locked by default: every package at the exact version in constraints.txt.
# RL4AGENTS_UNLOCKED=1 installs the newest versions setup.py allows instead (to try an upgrade;
# a later run without it goes back to the locked versions).
#
# pip runs only when something it depends on changed: .venv/rl4agents-install.stamp holds a
# hash of setup.py, constraints.txt, the extras and the switch, written after an install
# succeeds; a run that finds the same hash installs nothing. Delete the stamp to force one.
PYTHON="${PYTHON:-python3}"
case "${RL4AGENTS_UNLOCKED:-0}" in
  0 | 1) ;;
  *)
    echo "error: RL4AGENTS_UNLOCKED=${RL4AGENTS_UNLOCKED}; allowed: 1 (newest versions)," \
      "0 or unset (constraints.txt)" >&2
    return 2
    ;;
esac
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
_rl4agents_extras="dev${EXTRAS:+,$EXTRAS}"
_rl4agents_stamp="$(
  .venv/bin/python -c 'import hashlib, sys
h = hashlib.sha256()
for path in ("setup.py", "constraints.txt"):
    h.update(open(path, "rb").read() + b"\0")
h.update("\0".join(sys.argv[1:]).encode())
print(h.hexdigest())' "extras=$_rl4agents_extras" "unlocked=${RL4AGENTS_UNLOCKED:-0}"
)"
if [ "$(cat .venv/rl4agents-install.stamp 2>/dev/null)" != "$_rl4agents_stamp" ]; then
  rm -f .venv/rl4agents-install.stamp
  if [ "${RL4AGENTS_UNLOCKED:-0}" = 1 ]; then
    _rl4agents_pins=(--upgrade --upgrade-strategy eager)
  else
    _rl4agents_pins=(-c constraints.txt)
  fi
  # A failed install leaves no stamp and fails the `source` (the next run tries again).
  .venv/bin/python -m pip install -q --upgrade pip &&
    .venv/bin/python -m pip install -q "${_rl4agents_pins[@]}" -e ".[$_rl4agents_extras]" ||
    return
  echo "$_rl4agents_stamp" >.venv/rl4agents-install.stamp
fi
unset _rl4agents_extras _rl4agents_stamp _rl4agents_pins
