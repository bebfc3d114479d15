#!/usr/bin/env bash
# On a machine with a CUDA GPU, one prepared run (< 8 minutes on an H100/H200): the GPU twin's
# tests on the real GPU (the simulator-only checks skip there), then the benchmark: the twin
# (fused forward/backward vs the standard three kernels) and torch's unfused attention vs SDPA's
# fused backends in bf16/fp16/fp32, N = 1K..16K, d = 64/128, causal and not, each on the roofline;
# with Nsight Compute (ncu) on the PATH also its DRAM bytes of the twin.
#
#   tools/gpu_device_run.sh OUTDIR
#
# Writes OUTDIR/{nvidia-smi.txt,versions.txt,gpu_bench_fa2.json,gpu_bench.log,gpu_tests.log}.
# Commit OUTDIR/gpu_bench_fa2.json as flashlab/data/gpu_bench_fa2.json (it names the device,
# versions and date). The committed flashlab/data/gpu_bench.json is an earlier run of the old
# kernels (one thread per query row), kept as the chapter's "before". Wheels of the pinned numba / numba-cuda in
# ./.whl are installed into /tmp/site first when the machine's llvmlite is the one numba==0.68.1
# needs (0.50.x); otherwise the machine's own numba and numba-cuda are used, and versions.txt
# says which.
set -u
out=${1:?usage: tools/gpu_device_run.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
[ -d /usr/local/cuda ] && export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv \
  | tee "$out/nvidia-smi.txt"
if ls .whl/numba-0.68.1-*.whl >/dev/null 2>&1 \
   && $py -c "import llvmlite, sys; sys.exit(not llvmlite.__version__.startswith('0.50'))" 2>/dev/null; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/numba-0.68.1-*.whl .whl/numba_cuda-0.30.4-*.whl $(ls .whl/numpy-*.whl 2>/dev/null) && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$py - <<'PY' | tee "$out/versions.txt"
import importlib.metadata as m, sys
print("python", sys.version.split()[0])
for n in ("numpy", "scipy", "numba", "llvmlite", "numba-cuda", "cuda-bindings", "torch"):
    try:
        print(n, m.version(n))
    except m.PackageNotFoundError:
        print(n, "missing")
import numba, numba.cuda
print("numba imported from", numba.__file__, numba.__version__)
print("cuda available", numba.cuda.is_available())
PY
ncu_flag=""
command -v ncu >/dev/null 2>&1 && ncu_flag="--ncu"
timeout "${BENCH_TIMEOUT:-240}" $py -m flashlab.gpu.bench --out "$out/gpu_bench_fa2.json" $ncu_flag 2>&1 \
  | tee "$out/gpu_bench.log"
timeout "${TESTS_TIMEOUT:-200}" $py -m pytest tests/test_gpu.py tests/test_gpu_traffic.py \
  tests/test_gpu_exercises.py tests/test_gpu_bench.py tests/test_gpu_inspect.py -q -p no:cacheprovider \
  -rs --durations=8 2>&1 | tee "$out/gpu_tests.log"
