#!/usr/bin/env bash
# The main job: install, build, then train the default recipe on the bundled corpus (on the GPU
# when there is one, else the CPU: plan.device "auto"), writing progress, checkpoints, metrics, a
# loss plot and a text sample under runs/tiny/.
# Running it again starts afresh and replaces the previous main-job run there (--force);
# `./scripts/run_main.sh --resume` continues it instead.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
fresh=(--force)
for a in "$@"; do
  [ "$a" = "--resume" ] && fresh=()
done
# k3rt's OpenMP workers wait passively between parallel regions (the default, for shared
# machines, where spinning costs 1.5-3x). On a machine with nothing else running, those
# wake-ups cost the CPU main job about a third of its wall time (docs/PERFORMANCE.md, "Threads
# on a shared machine"), so when the CPUs are idle as training starts, the workers spin
# briefly before sleeping. A policy set in the environment is left as it is.
idle_percent() {  # of all CPUs over half a second, from /proc/stat's first line
  local u n s i w q sq st
  read -r _ u n s i w q sq st _ < /proc/stat
  local busy0=$((u + n + s + q + sq + st)) idle0=$((i + w))
  sleep 0.5
  read -r _ u n s i w q sq st _ < /proc/stat
  local busy=$((u + n + s + q + sq + st - busy0)) idle=$((i + w - idle0))
  echo $(( busy + idle > 0 ? 100 * idle / (busy + idle) : 0 ))
}
if [ -z "${OMP_WAIT_POLICY:-}${GOMP_SPINCOUNT:-}" ] && [ -r /proc/stat ] &&
   [ "$(idle_percent)" -ge 90 ]; then
  export GOMP_SPINCOUNT=50000
  echo "run_main.sh: the CPUs are idle: OpenMP workers spin briefly between parallel regions" \
       "(GOMP_SPINCOUNT=50000; OMP_WAIT_POLICY=passive ./scripts/run_main.sh waits passively)"
fi
exec ./build/bin/k3rt train scripts/recipes/tiny.lua "${fresh[@]}" "$@"
