#!/usr/bin/env bash
# Runs the walk-through of docs/plugins.md verbatim against a fresh install of this build.
#   walkthrough.sh DOC BUILD_DIR
# In DOC, a fenced block whose info string is `sh walkthrough` is a command block; one whose
# info string is `<lang> walkthrough file=NAME` is the content of file NAME. They are turned,
# in document order, into one script (command blocks as they are, files written where the
# commands stand at that point) run with `set -euo pipefail` in an empty folder, with
# K3RT_PREFIX naming the install and its bin/ first on PATH — the reader's setup. Afterwards the
# trained model is checked: its loss fell.
set -euo pipefail
doc=$1
build=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/k3rt_walkthrough_XXXXXX")
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/k3rt" >/dev/null
export K3RT_PREFIX="$work/k3rt"
export PATH="$K3RT_PREFIX/bin:$PATH"
unset K3RT_PLUGIN_PATH PKG_CONFIG_PATH

awk '
  function start(info,   n, f) {
    mode = ""; file = ""
    n = split(info, f, /[ \t]+/)
    if (f[2] != "walkthrough") return
    if (f[1] == "sh" && n == 2) { mode = "sh"; print "echo \"+++ walkthrough block " ++blocks "\""; return }
    if (f[3] ~ /^file=/) {
      file = substr(f[3], 6); mode = "file"
      print "cat > \x27" file "\x27 <<\x27K3RT_WALKTHROUGH_EOF\x27"
    }
  }
  /^```/ {
    if (inside) { if (mode == "file") print "K3RT_WALKTHROUGH_EOF"; inside = 0; mode = ""; next }
    inside = 1; start(substr($0, 4)); next
  }
  inside && mode != "" { print }
  END { if (inside) { print "echo \"unterminated code block\" >&2; exit 1" } }
' "$doc" > "$work/steps.sh"

grep -q 'walkthrough block' "$work/steps.sh" || { echo "no walkthrough blocks in $doc" >&2; exit 1; }
mkdir "$work/start"
cd "$work/start"
bash -euo pipefail "$work/steps.sh"

# The model trained: its first and last logged losses.
metrics=$(find "$work/start" -name metrics.jsonl | head -n 1)
[ -n "$metrics" ] || { echo "the walk-through trained nothing (no metrics.jsonl)" >&2; exit 1; }
first=$(grep -o '"loss":[0-9.]*' "$metrics" | head -n 1 | cut -d: -f2)
last=$(grep -o '"loss":[0-9.]*' "$metrics" | tail -n 1 | cut -d: -f2)
awk -v a="$first" -v b="$last" 'BEGIN {
  printf "walk-through: loss %s at the first logged step, %s at the last\n", a, b
  exit !(a > 5 && b < a - 1.5)
}' || { echo "the loss did not fall enough" >&2; exit 1; }
