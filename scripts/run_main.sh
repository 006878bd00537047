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
exec ./build/bin/k3rt train scripts/recipes/tiny.lua "${fresh[@]}" "$@"
