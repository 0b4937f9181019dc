#!/usr/bin/env bash
# The GPU suite, for a CUDA host: build the extension from source, then run the
# named stages in order, each logging to $OUT/<stage>.log, with a one-line
# result per stage in $OUT/summary.txt. A failed stage is recorded and the next
# one still runs; the exit status is non-zero if any stage failed.
#   OUT=build/gpu-suite bash benchmarks/gpu_suite.sh tests bench demo sanitize tp
# Stages: tests (pytest -m gpu), bench (bench_kernels.py), tiers (bench_tiers.py, trace_tier_load.py:
# where a load's time goes, and the example's host tier on CUDA), host (bench_host_cost.py:
# where an eager call's host time goes), ncu (every index kernel's GPU time), demo (the demo on
# CUDA with the captured decode graph), sanitize (compute-sanitizer memcheck +
# racecheck over the GPU index and manager tests), tp (the tensor-parallel
# consistency run under torchrun on every visible GPU), disagg (bench_disagg.py on loopback, the
# host's cores free for the copies; Mooncake from build/wheels where it is not installed, JSON in
# $OUT/disagg.json: see benchmarks/offline_mooncake.sh).
set -uo pipefail
OUT=${OUT:-build/gpu-suite}
mkdir -p "$OUT"
# NVLink multicast stays off for every stage (the GPU tests start NCCL too): on a
# shared host it can take the GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The image's /opt/gcc links libstdc++ statically into the extension, which
# crashes on the first integer formatted into an error message: use the system g++.
export CC=gcc CXX=g++ TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} PYTHONPATH=$PWD
status=0
stage() {  # stage NAME CMD...: run, log, remember a failure, go on
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "stage $name: rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
  tail -3 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/summary.txt"
python3 -c "import torch; print('torch', torch.__version__)" >>"$OUT/summary.txt"
git rev-parse --short HEAD >>"$OUT/summary.txt" 2>/dev/null
stage build python3 -m pip install --no-build-isolation --no-deps -e . -q || exit 1
SANITIZED="tests/index_ops/test_index_steps.py tests/index_ops/test_index_ops.py tests/index_ops/test_index_robustness.py
  tests/manager/test_kv_manager_gpu.py tests/index_ops/test_row_space_ops.py tests/transfer/test_row_transfer_ops.py
  tests/transfer/test_layer_row_transfer.py
  tests/integration/test_row_space_step_graph.py tests/tiers/test_object_checksums.py tests/tiers/test_tier_cache.py"
RACECHECKED="tests/index_ops/test_index_robustness.py tests/manager/test_kv_manager_gpu.py tests/index_ops/test_row_space_ops.py
  tests/transfer/test_row_transfer_ops.py tests/transfer/test_layer_row_transfer.py tests/tiers/test_object_checksums.py"
for s in "$@"; do
  case $s in
    tests) stage tests python3 -m pytest -q -m gpu tests ;;
    bench) stage bench python3 benchmarks/bench_kernels.py --iters 2000 --out "$OUT/bench.json" ;;
    host) stage host python3 benchmarks/bench_host_cost.py ;;
    ncu)  # each index kernel's GPU time without launch overhead, caches warm
      stage ncu ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum \
        -k regex:'_kernel$|index_metadata' --csv python3 benchmarks/bench_kernels.py --once ;;
    demo) stage demo python3 -m ukv_torch.demo --device cuda --json --plot "$OUT/demo_cuda.png" ;;
    tiers)  # KV tier save/load against pinned copies, host cost per block, decode with saves in flight
      stage tiers python3 benchmarks/bench_tiers.py --device cuda --prefixes 32768,131072 --json
      stage tiers-trace python3 benchmarks/trace_tier_load.py --device cuda
      stage tiers-example python3 examples/engine_loop.py --device cuda --tier host ;;
    sanitize)
      stage memcheck compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -q -m gpu $SANITIZED
      stage racecheck compute-sanitizer --tool racecheck --error-exitcode 1 python3 -m pytest -q -m gpu $RACECHECKED ;;
    disagg)
      stage disagg bash -c 'set -o pipefail; bash benchmarks/offline_mooncake.sh python3 benchmarks/bench_disagg.py \
        --rounds 3 --json | tee "$1"' _ "$OUT/disagg.json" ;;
    tp)
      stage tp python3 -m torch.distributed.run --standalone --nproc_per_node="$(nvidia-smi -L | wc -l)" \
        tests/integration/tp_consistency.py --steps 2000 --json
      stage tp-perturbed bash -c '! python3 -m torch.distributed.run --standalone --nproc_per_node=1 \
        tests/integration/tp_consistency.py --patterns scheduler --perturb-step 40' ;;
    *) echo "unknown stage $s" | tee -a "$OUT/summary.txt"; status=1 ;;
  esac
done
exit $status
