#!/usr/bin/env bash
# Regenerates the pictures of docs/gallery.md with the meshsim binary:
#   docs/images/gallery/NAME.png        the logical view of every examples/NAME.json
#   docs/images/gallery/NAME.ranks.png  the rank view of a few (RANK_VIEWS below)
#   docs/images/gallery/fsdp_tp_2x4.ranks.png  the rank view on 8 ranks (a scenario written below)
#   docs/images/gallery/*.MUTANT*.png   verdicts: a run with a planted bug, logical and rank view
#   docs/images/gallery/lm_call_opaque_unregistered.png  a failing example (examples/failing/)
#   docs/images/gallery/bugs_NAME.png   the user's bugs (examples/bugs/)
#   docs/images/fsdp_reduced.png        the README's picture
# The build lives in build/ (MESHSIM_BUILD_DIR changes it); the meshsim target is built first
# (MESHSIM_JOBS parallel jobs, default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${MESHSIM_BUILD_DIR:-build}
[ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"${MESHSIM_JOBS:-$(nproc)}" --target meshsim >/dev/null
meshsim="$build/cli/meshsim"

RANK_VIEWS=(fsdp_reduced fsdp_tp_2d tp_megatron_mlp fsdp2_strided_tp scale/fsdp_4096)

out=docs/images/gallery
mkdir -p "$out"
for f in examples/*.json; do
  name=$(basename "$f" .json)
  "$meshsim" render "$f" -o "$out/$name.png" >/dev/null
  echo "$out/$name.png"
done
for example in "${RANK_VIEWS[@]}"; do
  [ -f "examples/$example.json" ] || continue
  name=$(basename "$example")
  "$meshsim" render "examples/$example.json" -o "$out/$name.ranks.png" --view ranks >/dev/null
  echo "$out/$name.ranks.png"
done
# 8 ranks: fsdp_tp_2d on dp=2 x tp=4, where w's 10 columns split 3, 3, 3, 1 over tp, so the rank
# view draws two classes of ranks alike.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/fsdp_tp_2x4.json" <<'JSON'
{
  "format": "meshsim.scenario/1",
  "name": "fsdp_tp_2x4",
  "mesh": {"axes": ["dp", "tp"], "shape": [2, 4]},
  "inputs": [
    {"name": "x", "shape": [8, 6], "placements": ["S(0)", "R"]},
    {"name": "w", "shape": [6, 10], "placements": ["S(0)", "S(1)"], "requires_grad": true}
  ],
  "program": [
    {"out": "wf", "op": "redistribute", "args": ["w"], "placements": ["Rd", "S(1)"]},
    {"out": "y", "op": "mm", "args": ["x", "wf"]},
    {"out": "loss", "op": "sum", "args": ["y"]}
  ],
  "backward": "loss"
}
JSON
"$meshsim" render "$tmp/fsdp_tp_2x4.json" -o "$out/fsdp_tp_2x4.ranks.png" --view ranks >/dev/null
echo "$out/fsdp_tp_2x4.ranks.png"
# Verdicts: failing runs exit 1, which is what they show.
verdict() {  # verdict OUT ARGS...: meshsim run ARGS --render OUT, which must fail its checks
  local rc=0
  "$meshsim" run "${@:2}" --render "$1" >/dev/null || rc=$?
  [ "$rc" -eq 1 ] || { echo "expected a failing run: meshsim run ${*:2}" >&2; exit 1; }
  echo "$1"
}
# A failing example with an expect block exits 0 when it fails as recorded: drawn by render.
"$meshsim" render examples/failing/lm_call_opaque_unregistered.json -o "$out/lm_call_opaque_unregistered.png" >/dev/null
echo "$out/lm_call_opaque_unregistered.png"
# The user's bugs (examples/bugs), each failing (or moving bytes) as its expect block records.
for f in examples/bugs/*.json; do
  name=bugs_$(basename "$f" .json)
  "$meshsim" render "$f" -o "$out/$name.png" >/dev/null
  echo "$out/$name.png"
done
verdict "$out/q3_partial_and_reduced.cotangent_psum_as_r.png" examples/q3_partial_and_reduced.json \
  --option mutant=cotangent_psum_as_r
verdict "$out/tp_rowwise_partial.uneven_array_split.ranks.png" examples/tp_rowwise_partial.json \
  --option mutant=uneven_array_split --view ranks

"$meshsim" render examples/fsdp_reduced.json -o docs/images/fsdp_reduced.png >/dev/null
echo docs/images/fsdp_reduced.png
