#!/usr/bin/env bash
# One command to install what is missing, build, and run meshsim on Debian bookworm.
#   scripts/setup.sh examples   run every bundled example, print its result, write its diagram
#   scripts/setup.sh test       run the whole test suite through ctest
# Dependencies come from Debian packages only; apt-get runs only when one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

job=${1:-}
case "$job" in
  examples | test) ;;
  *) echo "usage: scripts/setup.sh examples|test" >&2; exit 2 ;;
esac

packages=(
  g++ cmake ninja-build pkg-config
  libtorch-dev librapidcheck-dev libgtest-dev libbenchmark-dev
  libgraphviz-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libgloo-dev
  libjemalloc-dev  # the executables' allocator (cmake/malloc.cmake)
  python3 python3-venv  # tools/crosscheck's environments (its packages come from PyPI, into the build dir)
)
. scripts/install_missing.sh
install_missing "${packages[@]}"

build=${MESHSIM_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${MESHSIM_WERROR:+-DMESHSIM_WERROR=ON} >/dev/null
if [ "$job" = test ]; then
  # tests/explore_browser.py drives the explorer in headless Chromium (it skips where they are missing).
  install_missing chromium chromium-driver python3-selenium
  cmake --build "$build" -j"$(nproc)"
  ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
  exit
fi

# The main job: every example, its result, its diagram and its explorer page (out/explore/NAME.html,
# written by the same process as the run: `run --explore`). An example may demonstrate a scenario
# the semantics refuse (exit 3, like reduced_policy_strict); a failed check (1) or bad input (2)
# fails the job.
# meshsim_installable: the command, its libraries and its man page, so that every install route of
# the README (cmake --install, cpack -G DEB) works from the build this job leaves.
cmake --build "$build" -j"$(nproc)" --target meshsim_installable
mkdir -p out/diagrams out/explore
failed=0
for f in examples/*.json examples/bugs/*.json; do
  name=$(basename "$f" .json)
  [[ "$f" == examples/bugs/* ]] && name="bugs_$name"
  rc=0
  "$build/cli/meshsim" run "$f" --render "out/diagrams/$name.svg" --trace "out/$name.trace.json" \
    --explore "out/explore/$name.html" || rc=$?
  echo "  diagram: out/diagrams/$name.svg"
  echo "  explorer: out/explore/$name.html"
  echo
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then failed=1; fi
done
# Every scenario under examples/ (bugs/, failing/ and scale/ included) once more, as a suite: each
# passes or meets its `expect` block.
"$build/cli/meshsim" run examples/ | tail -1 || { echo "meshsim run examples/: an expectation is not met"; failed=1; }
exit $failed
