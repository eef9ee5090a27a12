#!/usr/bin/env bash
# The GPU device check (scripts/device_check.py; DEVELOPERS.md says when and how to run it): installs the
# wheels carried in .whl/ (scripts/device_wheels.sh) into a folder of their own, then runs every step
# inside one time budget and writes $OUT/device_check.md (+ a few files beside it).
#
#   bash scripts/device_check.sh                      # OUT defaults to runs/device_check
#   DEVICE_CHECK_DRY=1 bash scripts/device_check.sh   # no CUDA (or this): the CPU-possible parts
#   DEVICE_CHECK_STEPS=cuda-tests,serve ...           # only these steps (environment always runs)
#   DEVICE_CHECK_BUDGET_S=480                         # the whole check's budget, seconds
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/device_check}
SITE=${DEVICE_CHECK_SITE:-/tmp/site}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export DEVICE_CHECK_WHEELS="none carried"
if ls .whl/*.whl >/dev/null 2>&1; then
  if "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    # the device tool's README's own line; --target: the image's packages stay as they are
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
         .whl/*.whl >"$OUT/.pip.log" 2>&1; then
      DEVICE_CHECK_WHEELS="$(ls .whl/*.whl | wc -l) wheels installed into $SITE"
      export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    else
      DEVICE_CHECK_WHEELS="install FAILED: $(tail -n 3 "$OUT/.pip.log" | tr '\n' ' ')"
    fi
    rm -f "$OUT/.pip.log"
  else
    DEVICE_CHECK_WHEELS="not installed: they are for Python 3.12, this is $("$PY" -c 'import sys; print(sys.version.split()[0])')"
  fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
budget=${DEVICE_CHECK_BUDGET_S:-480}
# the driver keeps to the budget itself; this bound is for the driver's own hang
exec timeout -k 10 $((budget + 60)) "$PY" scripts/device_check.py --out "$OUT" "$@"
