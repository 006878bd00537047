# Sourced by the torch tests: sets PY to the first python3 with torch (K3RT_TORCH_PYTHON, then
# python3, then /usr/bin/python3, which may differ from the one on PATH), or exits 77 (skip).
PY=""
for cand in ${K3RT_TORCH_PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" 2>/dev/null; then
        PY=$cand
        break
    fi
done
if [ -z "$PY" ]; then
    echo "SKIP: no python3 with torch (set K3RT_TORCH_PYTHON)"
    exit 77
fi
