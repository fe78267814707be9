#!/usr/bin/env bash
# The checks that need a GPU (docs/engines.md, "NCCL on a GPU"), in two halves:
#
#   scripts/gpu_check.sh --prepare WHEEL   here, on the build machine: builds meshsim, test_validate
#                                          and meshsim_bench_ops against the libtorch inside WHEEL
#                                          (the PyPI torch wheel of the same version and build as the
#                                          GPU machine's torch) with the NCCL engine on, and packs
#                                          them with the libraries the GPU machine lacks into
#                                          gpu_carry/ (ignored by git)
#   gpu_carry/src/scripts/gpu_check.sh     there, from the repository's root, with gpu_carry/
#                                          carried: writes every result under $OUT (default
#                                          out/gpu; GPU_CHECK_ONLY=validate or perf: that step alone). gpu_carry/src is this script, tools/ and
#                                          examples/ as of the commit the binaries were built from,
#                                          so what runs there is one version whatever the tree holds
#
# Why two halves: the GPU machine reaches no network and has none of Debian's packages that
# meshsim builds with (nlohmann-json, CLI11, RapidCheck, Graphviz, gloo's headers); its CUDA,
# NCCL and PyTorch are there. The binaries are built against the libtorch of the identical wheel
# (the run refuses to go on when the machine's torch is another build: torch.version.git_version),
# and find the machine's libtorch, CUDA runtime and NCCL at run time.
#
# What the run does, each step's output in its own file under $OUT:
#   env.txt          the GPU, driver, CUDA, NCCL (the library meshsim loads), torch
#   validate.txt     meshsim validate --backend nccl on every example whose mesh fits the machine's
#                    GPUs (NCCL refuses two ranks on one GPU), on each example's one-rank variant
#                    (every mesh axis of size 1), and one refusal of a mesh too large; then the
#                    NCCL engine's tests (test_validate) and a two-rank NCCL group on one GPU in
#                    PyTorch (what NCCL says)
#   crosscheck.json  tools/crosscheck on PyTorch's DTensor with CUDA tensors (LocalTensorMode)
#   crosscheck.md    against meshsim run, every example
#   perf.json        tools/crosscheck/perf: time per op, LocalTensorMode on CUDA and on the CPU
#                    against meshsim (on the CPU), one run
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

if [ "${1:-}" = "--prepare" ]; then
  set -e
  WHEEL=${2:?usage: scripts/gpu_check.sh --prepare TORCH_WHEEL.whl|UNPACKED_DIR}
  if [ -d "$WHEEL" ]; then  # a wheel unpacked before (its torch/ inside): the build stays as it is
    T=$(cd "$WHEEL" && pwd)
  else
    T=$ROOT/build-gpu/torch
    rm -rf "$T" && mkdir -p "$T"
    unzip -q -o "$WHEEL" 'torch/lib/*' 'torch/include/*' 'torch/share/*' 'torch/version.py' -d "$T"
  fi
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHSIM_WERROR=ON \
        -DCMAKE_PREFIX_PATH="$T/torch/share/cmake" | grep 'meshsim:'
  cmake --build build-gpu --target meshsim test_validate meshsim_bench_ops
  rm -rf gpu_carry && mkdir -p gpu_carry/bin gpu_carry/lib gpu_carry/src
  git archive HEAD scripts tools examples | tar -x -C gpu_carry/src
  git describe --always --dirty > gpu_carry/commit
  cp build-gpu/cli/meshsim build-gpu/tests/test_validate build-gpu/bench/meshsim_bench_ops gpu_carry/bin/
  # Every library they load that is neither glibc's nor the C++ runtime nor torch's, CUDA's or
  # NCCL's (the GPU machine has those).
  for b in gpu_carry/bin/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libz)\.so|/torch/lib/|/cuda/|libnccl|libcudart' |
    while read -r lib; do cp -L "$lib" gpu_carry/lib/; done
  python3 - "$T/torch/version.py" > gpu_carry/torch_built_against <<'EOF'
import sys
ns = {}
exec(open(sys.argv[1]).read(), ns)
print(ns["__version__"], ns["git_version"])
EOF
  echo "$ROOT" > gpu_carry/built_root
  EXCLUDE=$(git rev-parse --git-path info/exclude)
  echo /gpu_carry/ >> "$EXCLUDE" && sort -u -o "$EXCLUDE" "$EXCLUDE"
  du -sh gpu_carry
  echo "built against torch $(cat gpu_carry/torch_built_against); carry gpu_carry to the GPU machine"
  exit 0
fi

OUT=${OUT:-$ROOT/out/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
CARRY=$(cd "$ROOT/.." && pwd)  # gpu_carry, where this copy of the script lies under src/
BIN=$CARRY/bin
if [ ! -x "$BIN/meshsim" ]; then
  echo "gpu_check: no $BIN/meshsim: run scripts/gpu_check.sh --prepare TORCH_WHEEL on the build machine and" \
       "run gpu_carry/src/scripts/gpu_check.sh" >&2
  exit 2
fi
step() { echo "== $* ($(date +%T))"; }

# --- the machine, and the libraries the binaries load there ---------------------------------------
step environment
TORCH_LIB=$($PY -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
NV=$($PY -c 'import os, nvidia; print(os.path.dirname(nvidia.__path__[0]) + "/nvidia")' 2>/dev/null || true)
LIBS=$CARRY/lib:$TORCH_LIB
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib "$NV"/cu13/lib "$NV"/nccl/lib "$NV"/cuda_runtime/lib; do
  [ -d "$d" ] && LIBS=$LIBS:$d
done
# The binaries run through wrappers that name these libraries: Python and the machine's own
# programs keep the machine's (gpu_carry/lib holds Debian's builds of Graphviz and the like).
mkdir -p build-gpu/cli build-gpu/bench build-gpu/tests
for b in cli/meshsim bench/meshsim_bench_ops tests/test_validate; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' "$LIBS" "$BIN/$(basename $b)" > build-gpu/$b
  chmod +x build-gpu/$b
done
MESHSIM=$ROOT/build-gpu/cli/meshsim
{
  echo "date: $(date -u)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "gpus: $(nvidia-smi -L 2>/dev/null | wc -l)"
  $PY - <<'EOF'
import torch
print("torch", torch.__version__, torch.version.git_version, "cuda", torch.version.cuda,
      "nccl (torch's)", ".".join(map(str, torch.cuda.nccl.version())), "device", torch.cuda.get_device_name())
EOF
  echo "meshsim $(cat "$CARRY/commit") built against torch $(cat "$CARRY/torch_built_against")"
  echo "meshsim: $("$MESHSIM" --version 2>&1)"
  echo "libraries meshsim loads (torch, CUDA, NCCL):"
  LD_LIBRARY_PATH=$LIBS ldd "$BIN/meshsim" | grep -E 'torch|c10|cudart|nccl|not found'
  for h in /usr/local/cuda/include/nccl.h; do
    [ -f $h ] && echo "nccl.h: $(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' $h | awk '{printf "%s.", $3}')"
  done
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
built=$(awk '{print $2}' "$CARRY/torch_built_against")
here=$($PY -c 'import torch; print(torch.version.git_version)')
if [ "$built" != "$here" ]; then
  echo "gpu_check: this machine's torch ($here) is not the build meshsim was built against ($built)" | tee -a "$OUT/env.txt"
  exit 3
fi

# The tests find meshsim and the examples where they were built (MESHSIM_BIN, MESHSIM_SOURCE_DIR).
BUILT_ROOT=$(cat "$CARRY/built_root")
if [ "$BUILT_ROOT" != "$ROOT" ] && [ ! -e "$BUILT_ROOT" ]; then
  mkdir -p "$(dirname "$BUILT_ROOT")" && ln -s "$ROOT" "$BUILT_ROOT"
fi

if [ "${GPU_CHECK_ONLY:-}" != perf ]; then  # GPU_CHECK_ONLY=perf: step 2 alone
# --- 1. validate on NCCL ----------------------------------------------------------------------------
step "validate --backend nccl"
V=$OUT/validate.txt
: > "$V"
ONE=$(mktemp -d)
$PY - "$ONE" <<'EOF'
import glob, json, os, sys
# Each example with every mesh axis of size 1: the program, its placements and its checks as
# written, on a mesh one GPU can hold.
for f in sorted(glob.glob("examples/**/*.json", recursive=True)):
    try:
        doc = json.load(open(f))
    except ValueError:
        continue
    if not isinstance(doc, dict) or doc.get("format") != "meshsim.scenario/1":
        continue
    doc["mesh"]["shape"] = [1] * len(doc["mesh"]["shape"])
    out = os.path.join(sys.argv[1], f.replace("/", "__"))
    json.dump(doc, open(out, "w"))
EOF
# One validate per file, 8 at a time (each is a worker process and a coordinator).
ls examples/regressions/gelu_strided_grad_float32.json "$ONE"/*.json |
  xargs -P 8 -I{} sh -c 'o=$(NCCL_DEBUG=WARN timeout 120 "$0" validate "$1" --backend nccl 2>&1); echo "exit $?: $1: $(echo "$o" | grep -E "^status:|rank 0:|rror" | head -3 | tr "\n" " ")"' "$MESHSIM" {} |
  sort -t: -k2 > "$ONE/runs"
cat "$ONE/runs" >> "$V"
echo "one-rank meshes on nccl: $(grep -c '^exit 0:' "$ONE/runs") pass, $(grep -c '^exit 1:' "$ONE/runs") fail," \
     "$(grep -v -c -E '^exit (0|1):' "$ONE/runs") other (refused as written or an engine error), of $(wc -l < "$ONE/runs")" | tee -a "$V"
echo "-- a mesh larger than the machine (4 ranks, 1 GPU):" >> "$V"
"$MESHSIM" validate examples/fsdp_reduced.json --backend nccl >> "$V" 2>&1; echo "exit $?" >> "$V"
echo "-- NCCL_DEBUG=INFO on the one-rank transformer (the library, algorithm and protocol):" >> "$V"
NCCL_DEBUG=INFO "$MESHSIM" validate "$ONE/examples__transformer_fsdp_tp_sp.json" --backend nccl 2>&1 |
  grep -E 'NCCL (INFO|WARN) (NCCL version|cudaDriverVersion|Using|Channel 00|comm|ALGO|PROTO)|status:' | head -20 >> "$V"
echo "-- the NCCL engine's tests (test_validate):" >> "$V"
timeout 120 build-gpu/tests/test_validate --gtest_filter='Validate.Nccl*:Validate.BadRequests*' >> "$V" 2>&1
echo "test_validate exit $?" | tee -a "$V"
echo "-- two ranks on one GPU in PyTorch (NCCL's own answer):" >> "$V"
cat > "$ONE/two_ranks.py" <<'EOF'
import os, torch, torch.distributed as dist, torch.multiprocessing as mp
def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda:0"))
    t = torch.ones(4, device="cuda")
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
        print(f"rank {rank}: all_reduce gave {t.tolist()}", flush=True)
    except Exception as e:
        print(f"rank {rank}: {type(e).__name__}: {' / '.join(str(e).splitlines()[:4])}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(worker, nprocs=2)
EOF
timeout 45 $PY "$ONE/two_ranks.py" >> "$V" 2>&1
echo "python exit $?" >> "$V"
tail -n 5 "$V"

if [ "${GPU_CHECK_ONLY:-}" = validate ]; then step done; exit 0; fi  # a second try of step 1 alone
fi

# --- 2. time per op: LocalTensorMode on CUDA and on the CPU, meshsim on the CPU -----------------------
step perf
for dev in cuda cpu; do
  echo "-- LocalTensorMode on $dev:"
  timeout 240 $PY tools/crosscheck/perf --build build-gpu --python "$(command -v $PY)" --device $dev --rounds 3 \
    --json "$OUT/perf_$dev.json"
done > "$OUT/perf.txt" 2>&1
cat "$OUT/perf.txt"
if [ "${GPU_CHECK_ONLY:-}" = perf ]; then step done; exit 0; fi
# --- 3. PyTorch's DTensor on CUDA against meshsim ---------------------------------------------------
step "crosscheck --device cuda"
timeout 240 $PY tools/crosscheck/crosscheck --system pytorch --python "$(command -v $PY)" --device cuda \
  --meshsim "$MESHSIM" --json "$OUT/crosscheck.json" --markdown "$OUT/crosscheck.md" --quiet examples \
  > "$OUT/crosscheck.txt" 2>&1
echo "crosscheck exit $?" | tee -a "$OUT/crosscheck.txt"
tail -n 6 "$OUT/crosscheck.txt"

step done
