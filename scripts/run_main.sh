#!/usr/bin/env bash
# The main job: install, build, then train the default recipe on the bundled corpus (CPU),
# writing progress, checkpoints, metrics, a loss plot and a text sample under runs/tiny/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec ./build/bin/k3rt train scripts/recipes/tiny.lua "$@"
