#!/usr/bin/env bash
# Rewrites the two tables of docs/import.md from the importers' own tables (Python's standard
# library only): the aten table between
#   <!-- BEGIN meshsim import table --markdown -->  and  <!-- END meshsim import table --markdown -->
# from `tools/import/meshsim-import table --markdown` (tools/import/aten_table.py), and the jaxpr
# primitive table between
#   <!-- BEGIN jax import table --markdown -->  and  <!-- END jax import table --markdown -->
# from `tools/import/jax_importer.py --markdown-table`.
#   scripts/gen_import_table.sh           rewrite the table
#   scripts/gen_import_table.sh --check   exit 1 when the table is stale (ctest import_table_current)
set -euo pipefail
cd "$(dirname "$0")/.."

doc=docs/import.md
table=$(mktemp)
out=$(mktemp)
trap 'rm -f "$table" "$out"' EXIT
cp "$doc" "$out"
# fill MARKER_NAME COMMAND...: the lines between the marker pair become the command's output.
fill() {
  local begin="<!-- BEGIN $1 --markdown -->" end="<!-- END $1 --markdown -->"
  shift
  if [ "$(grep -cxF -- "$begin" "$out")" != 1 ] || [ "$(grep -cxF -- "$end" "$out")" != 1 ]; then
    echo "gen_import_table.sh: $doc must hold each marker line once: $begin ... $end" >&2
    exit 2
  fi
  "$@" >"$table"
  awk -v begin="$begin" -v end="$end" -v table="$table" '
    $0 == begin { print; while ((getline line < table) > 0) print line; skip = 1; next }
    $0 == end { skip = 0 }
    !skip { print }
  ' "$out" >"$out.new"
  mv "$out.new" "$out"
}
fill "meshsim import table" python3 tools/import/meshsim-import table --markdown
fill "jax import table" python3 tools/import/jax_importer.py --markdown-table
if cmp -s "$out" "$doc"; then
  echo "$doc: the import tables are current"
elif [ "${1:-}" = "--check" ]; then
  echo "$doc: the import tables are stale (tools/import changed): run scripts/gen_import_table.sh" >&2
  diff "$doc" "$out" | head -20 >&2
  exit 1
else
  cat "$out" >"$doc"
  echo "$doc: import tables rewritten from the importers' own tables"
fi
