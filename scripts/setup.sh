#!/usr/bin/env bash
# Installs what k3rt needs on a Debian/Ubuntu machine (when missing) and builds it into build/.
# Used by run_main.sh and test.sh; safe to run again.
#   --fuzz           also clang with its libFuzzer runtime and OpenMP (scripts/fuzz.sh)
#   --packages-only  install, do not build
#   --test-deps      also what only the tests use: the distribution's PyTorch (CPU), for the
#                    parity of torch_k3.py / torch_dense.py with k3rt (integration/torch_parity)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config liblua5.4-dev libjansson-dev check libsubunit-dev
          libopenblas-openmp-dev zlib1g-dev python3 python3-numpy openmpi-bin libopenmpi-dev)
# A CUDA build also takes CUTLASS's headers (pinned; the grouped expert GEMMs), installed with
# pip into .deps/ (git-ignored) rather than into the system's Python.
cutlass_version=4.2.0.0
nvcc_found=0
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  nvcc_found=1
fi
# scripts/data/prepare.py's Hugging Face tokenizers (pinned), also into .deps/ with pip: its
# test (integration/test_prepare) reads tests/fixtures/tokenizer.json and downloads nothing.
tokenizers_version=0.23.3
python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
build=1
for a in "$@"; do
  case "$a" in
    --fuzz) packages+=(clang libclang-rt-14-dev libomp-14-dev) ;;
    --test-deps) packages+=(python3-torch) ;;
    --packages-only) build=0 ;;
    *) echo "setup.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cutlass_args=""
case " ${K3RT_CMAKE_ARGS:-} " in *"K3RT_CUDA=OFF"*) nvcc_found=0 ;; esac
if [ "$nvcc_found" -eq 1 ]; then
  cutlass_dir=".deps/nvidia-cutlass-$cutlass_version"
  if [ ! -e "$cutlass_dir/cutlass_library/source/include/cutlass/version.h" ]; then
    echo "installing nvidia-cutlass==$cutlass_version (headers) into $cutlass_dir"
    python3 -m pip install -q --no-deps --no-compile --target "$cutlass_dir" \
      "nvidia-cutlass==$cutlass_version"
  fi
  cutlass_args="-DK3RT_CUTLASS_DIR=$PWD/$cutlass_dir/cutlass_library/source"
fi
if ! PYTHONPATH=.deps/python python3 -c "import tokenizers" >/dev/null 2>&1; then
  echo "installing tokenizers==$tokenizers_version into .deps/python"
  python3 -m pip install -q --no-deps --no-compile --target .deps/python \
    "tokenizers==$tokenizers_version" ||
    echo "setup.sh: tokenizers did not install; integration/test_prepare will skip" >&2
fi
[ "$build" -eq 1 ] || exit 0

build_dir="${K3RT_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release $cutlass_args ${K3RT_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
