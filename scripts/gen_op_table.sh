#!/usr/bin/env bash
# Rewrites the op table of docs/scenario-format.md, the lines between
#   <!-- BEGIN meshsim ops --markdown -->  and  <!-- END meshsim ops --markdown -->,
# with the output of `meshsim ops --markdown` (the op catalog, core/ops.cpp). ctest's
# Cli.ScenarioFormatOpTableIsCurrent fails when the two differ.
#   scripts/gen_op_table.sh            with build/cli/meshsim (MESHSIM_BUILD_DIR changes build/)
#   scripts/gen_op_table.sh MESHSIM    with that meshsim binary
set -euo pipefail
cd "$(dirname "$0")/.."

meshsim=${1:-${MESHSIM_BUILD_DIR:-build}/cli/meshsim}
doc=docs/scenario-format.md
begin='<!-- BEGIN meshsim ops --markdown -->'
end='<!-- END meshsim ops --markdown -->'

if [ ! -x "$meshsim" ]; then
  echo "gen_op_table.sh: $meshsim: no meshsim binary (build the meshsim target, or name the binary)" >&2
  exit 2
fi
if [ "$(grep -cxF -- "$begin" "$doc")" != 1 ] || [ "$(grep -cxF -- "$end" "$doc")" != 1 ]; then
  echo "gen_op_table.sh: $doc must hold each marker line once: $begin ... $end" >&2
  exit 2
fi

table=$(mktemp)
out=$(mktemp)
trap 'rm -f "$table" "$out"' EXIT
"$meshsim" ops --markdown >"$table"
awk -v begin="$begin" -v end="$end" -v table="$table" '
  $0 == begin { print; while ((getline line < table) > 0) print line; skip = 1; next }
  $0 == end { skip = 0 }
  !skip { print }
' "$doc" >"$out"
if cmp -s "$out" "$doc"; then
  echo "$doc: the op table is current"
else
  cat "$out" >"$doc"
  echo "$doc: op table rewritten from $meshsim ops --markdown"
fi
