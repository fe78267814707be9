#!/usr/bin/env bash
# Rewrites the aten table of docs/import.md, the lines between
#   <!-- BEGIN meshsim import table --markdown -->  and  <!-- END meshsim import table --markdown -->,
# with the output of `tools/import/meshsim-import table --markdown` (the one table the PyTorch
# importer maps with, tools/import/aten_table.py; Python's standard library only).
#   scripts/gen_import_table.sh           rewrite the table
#   scripts/gen_import_table.sh --check   exit 1 when the table is stale (ctest import_table_current)
set -euo pipefail
cd "$(dirname "$0")/.."

doc=docs/import.md
begin='<!-- BEGIN meshsim import table --markdown -->'
end='<!-- END meshsim import table --markdown -->'
if [ "$(grep -cxF -- "$begin" "$doc")" != 1 ] || [ "$(grep -cxF -- "$end" "$doc")" != 1 ]; then
  echo "gen_import_table.sh: $doc must hold each marker line once: $begin ... $end" >&2
  exit 2
fi
table=$(mktemp)
out=$(mktemp)
trap 'rm -f "$table" "$out"' EXIT
python3 tools/import/meshsim-import table --markdown >"$table"
awk -v begin="$begin" -v end="$end" -v table="$table" '
  $0 == begin { print; while ((getline line < table) > 0) print line; skip = 1; next }
  $0 == end { skip = 0 }
  !skip { print }
' "$doc" >"$out"
if cmp -s "$out" "$doc"; then
  echo "$doc: the aten table is current"
elif [ "${1:-}" = "--check" ]; then
  echo "$doc: the aten table is stale (tools/import/aten_table.py changed): run scripts/gen_import_table.sh" >&2
  diff "$doc" "$out" | head -20 >&2
  exit 1
else
  cat "$out" >"$doc"
  echo "$doc: aten table rewritten from tools/import/meshsim-import table --markdown"
fi
