#!/usr/bin/env bash
# On the GPU machine: the routed-MoE GPU tests (tests/gpu/test_latent_moe_cuda.c: routing and
# the latent_moe layer against the CPU; tests/gpu/test_balancers_cuda.c: quantile, aux_free,
# aux_loss against the CPU), both under compute-sanitizer memcheck at small shapes, `k3rt
# check-plugin` for latent_moe and each balancer, and a short training of
# scripts/bench/moe_tiny.lua on the GPU (f32) beside the same run on the CPU, with a balancer
# swapped in mid-run (train.changes), the core's grouped-GEMM and training-step GPU tests, and
# (section "step") K3-mini's step under --profile with the shared experts on their own stream
# and on the call's stream, and with the aux_loss balancer. Builds nothing: the build machine
# fills DIR with
# scripts/gpu/pack.sh build-cuda .devbuild/moe gpu_test_latent_moe_cuda gpu_test_balancers_cuda \
#     gpu_test_cuda_ops gpu_test_train_step
#
#   scripts/gpu/moe.sh [DIR]        (default .devbuild/moe)
# The device receives the session's checkout only: from another worktree, copy DIR (as build/),
# libs/, scripts/gpu/{moe,env}.sh, scripts/bench/moe_tiny.lua, scripts/recipes/k3_mini.lua and
# data/tinyshakespeare.txt into that checkout's ignored .devbuild/moe/, carry ".devbuild/moe"
# and run .devbuild/moe/scripts/gpu/moe.sh .devbuild/moe/build.
# Logs go to MOE_LOGS (default /tmp/moe-logs) and, packed, to $OUT/moe_logs.tgz (the device
# returns few files). MOE_SECTIONS (default "tests check memcheck train step") picks the
# sections, run in that order; MOE_BUDGET_S (default 480) is the whole script's seconds: a
# command gets what is left, and a section that no longer fits is skipped and said so.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/.devbuild/moe}" && pwd)
LOGS=${MOE_LOGS:-/tmp/moe-logs}
mkdir -p "$LOGS"
START=$(date +%s)
BUDGET=${MOE_BUDGET_S:-480}
. "$ROOT/scripts/gpu/env.sh"
export K3RT_PLUGIN_PATH=$BUILD/plugins K3RT_BIN=$BUILD/bin/k3rt K3RT_SOURCE_DIR=$ROOT
export CK_DEFAULT_TIMEOUT=600 K3RT_THREADS=8
want() { case " ${MOE_SECTIONS:-tests check memcheck train step} " in *" $1 "*) return 0 ;; esac; return 1; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
run() {  # run NAME SECONDS COMMAND...: the log in $LOGS/NAME.log, a one-line verdict here
    local name=$1 limit=$2 t0=$(date +%s)
    shift 2
    [ "$limit" -gt "$(left)" ] && limit=$(left)
    if [ "$limit" -lt 5 ]; then echo "$name: not run (budget spent)"; return 0; fi
    LD_LIBRARY_PATH=$LIBPATH timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc ($(( $(date +%s) - t0 )) s)"
    return $rc
}
status=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1
if want tests; then
    run test_latent_moe_cuda 100 "$BUILD/bin/gpu_test_latent_moe_cuda" || status=1
    grep -E "FAILED|Checks" "$LOGS/test_latent_moe_cuda.log" | head -20
    run test_balancers_cuda 60 "$BUILD/bin/gpu_test_balancers_cuda" || status=1
    grep -E "FAILED|Checks" "$LOGS/test_balancers_cuda.log" | head -20
    for t in gpu_test_cuda_ops gpu_test_train_step; do  # the grouped GEMMs; a whole step
        [ -x "$BUILD/bin/$t" ] || { echo "$t: not in $BUILD/bin (pack it)"; status=1; continue; }
        run "$t" 90 "$BUILD/bin/$t" || status=1
        grep -E "FAILED|Checks" "$LOGS/$t.log" | head -10
    done
fi
if want check; then
    for spec in "latent_moe" "quantile" "quantile --config {\"mode\":\"exact\"}" "aux_free" \
                "aux_loss"; do
        name=check_$(echo "$spec" | tr -c 'a-z_\n' '_' | sed 's/_*$//')
        run "$name" 60 "$BUILD/bin/k3rt" check-plugin $spec || status=1
        grep -E "cuda|FAIL|PASS.*check|passed|failed" "$LOGS/$name.log" | head -6
    done
fi
if want memcheck; then
    cs="compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3"
    K3RT_MOE_TEST_SMALL=1 run memcheck_latent_moe 120 $cs "$BUILD/bin/gpu_test_latent_moe_cuda" \
        || status=1
    tail -2 "$LOGS/memcheck_latent_moe.log"
    K3RT_BAL_TEST_SMALL=1 run memcheck_balancers 60 $cs "$BUILD/bin/gpu_test_balancers_cuda" \
        || status=1
    tail -2 "$LOGS/memcheck_balancers.log"
fi
if want train; then
    recipe=$ROOT/scripts/bench/moe_tiny.lua
    common=(--set train.steps=16 --set plan.dtype='"f32"' --set model.balancer='k3.quantile{}'
            --set train.changes='{ {step = 9, balancer = k3.aux_free{}} }' --no-sample --force)
    run train_cuda 60 "$BUILD/bin/k3rt" train "$recipe" "${common[@]}" \
        --set plan.device='"cuda"' --out "$LOGS/train_cuda" || status=1
    run train_cpu 60 "$BUILD/bin/k3rt" train "$recipe" "${common[@]}" \
        --set plan.device='"cpu"' --out "$LOGS/train_cpu" || status=1
    for d in cuda cpu; do
        echo "$d losses:"
        grep -o '"loss":[^,]*' "$LOGS/train_$d/metrics.jsonl" 2>/dev/null | tr '\n' ' ' | head -c 900
        echo
    done
    # aux_loss over two micro-batches a step: the GPU's sum is staged on the device and read
    # once per step (aux_loss_add); it must equal the CPU's
    aux=(--set train.steps=4 --set plan.dtype='"f32"' --set plan.grad_accum=2
         --set model.balancer='k3.aux_loss{alpha=0.01}' --no-sample --force)
    for d in cuda cpu; do
        run "aux_$d" 60 "$BUILD/bin/k3rt" train "$recipe" "${aux[@]}" --set plan.device="\"$d\"" \
            --out "$LOGS/aux_$d" || status=1
    done
    paste <(grep -o '"aux_loss":[^,]*' "$LOGS/aux_cuda/metrics.jsonl" 2>/dev/null | cut -d: -f2) \
          <(grep -o '"aux_loss":[^,]*' "$LOGS/aux_cpu/metrics.jsonl" 2>/dev/null | cut -d: -f2) |
        awk '{ n++; d = $1 - $2; if (d < 0) d = -d; if (!($2 > 0) || d > 1e-6 * $2) bad++
               printf "aux_loss step %d: cuda %s cpu %s\n", n, $1, $2 }
             END { if (n == 0 || bad) { print "aux_loss: GPU and CPU differ (or no steps)"; exit 1 } }' \
        || status=1
fi
if want step; then
    # K3-mini (bf16): the LatentMoE rows of --profile summed over the 15 layers, and the step
    step=(train "$ROOT/scripts/recipes/k3_mini.lua" --set train.steps=6 --set train.log_interval=1
          --set train.eval_interval=1000 --set train.checkpoint_interval=1000 --no-sample
          --force --profile 3)
    for v in "overlap:" "one_stream:--set model.ffn.overlap_shared=false" \
             "aux_loss:--set model.balancer=k3.aux_loss{}"; do
        name=step_${v%%:*}
        run "$name" 150 "$BUILD/bin/k3rt" "${step[@]}" ${v#*:} --out "$LOGS/$name" || status=1
        awk -v n="$name" '/\(latent_moe\)/ { ms[$(NF-3)] += $(NF-1) }
            /step \(wall\)/ { wall = $NF }
            END { printf "%s: latent_moe forward %.1f ms, backward %.1f ms (15 layers), step %s ms\n",
                  n, ms["forward"], ms["backward"], wall }' "$LOGS/$name.log"
    done
fi
tar czf "${OUT:-$ROOT}/moe_logs.tgz" -C "$LOGS" --exclude=checkpoints . 2>/dev/null
echo "total $(( $(date +%s) - START )) s, exit $status"
exit $status
