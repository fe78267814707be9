#!/usr/bin/env bash
# Mutation score of the property suite (`meshsim check`): plants each source-level bug of
# scripts/mutations.tsv in a scratch copy of the tree, rebuilds, and asks whether the suite fails.
# Not part of CI.
#   scripts/mutate.sh                       every mutation of the catalog, 100 cases, seed 1
#   scripts/mutate.sh --only ID [--only ID] only these mutations
#   scripts/mutate.sh --verify [--ref REV]  only check that every catalog text occurs exactly once
#                                           (in the working tree, or at git revision REV); no build
# Options: --seed S (1), --cases N (100), --jobs J (build jobs, nproc), --timeout SECONDS (per
# mutated check; default ten times the baseline check, at least 60), --min-score PERCENT (90),
# --catalog FILE (scripts/mutations.tsv).
#
# The scratch copy (tracked and untracked-not-ignored files) lives in
# ${MESHSIM_MUTATE_DIR:-build-mutate}/src and its Release build in .../build; both are kept
# between runs: a file whose content is unchanged keeps its mtime, so a re-run rebuilds only what
# changed. The baseline `meshsim check --seed S --cases N` must pass first. Then per mutation:
# apply (the text must occur exactly once, else `not-applicable`), rebuild `meshsim` (a failed
# build is `stillborn`), run the check under `timeout`, restore the file (also on Ctrl-C).
# Outcomes: killed (exit 1; the FAILed properties are listed), survived (exit 0), equivalent
# (exit 0 and the catalog says why it cannot be told apart), timeout (counted as killed),
# error (any other exit code: counted, not killed).
# score = (killed + timeout) / (total - equivalent - stillborn - not-applicable), in percent.
# Writes the report (a markdown table) to stdout and to .../report.md, logs to .../logs/.
# Exit: 0 when the score is at least --min-score, 1 below it (or when nothing was scored), 2 on
# a usage or setup error (the baseline does not build or does not pass included).
#
# Catalog lines (scripts/mutations.tsv), tab-separated: id, file (repo-relative), the exact text
# to find, its replacement, the bug class; optionally a 6th column `equivalent: REASON`. `#`
# starts a comment line. In the two texts, \n, \t and \\ stand for a newline, a tab and a
# backslash; everything else is literal (no regex).
set -euo pipefail
caller=$(pwd)
cd "$(dirname "$0")/.."
repo=$(pwd)

command_line="scripts/mutate.sh$(printf ' %q' "$@")"
seed=1
cases=100
jobs=$(nproc)
timeout_s=""
min_score=90
catalog=$repo/scripts/mutations.tsv
verify=0
ref=""
only=()
usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case "$1" in
    --seed) seed=${2:?}; shift 2 ;;
    --cases) cases=${2:?}; shift 2 ;;
    --jobs) jobs=${2:?}; shift 2 ;;
    --timeout) timeout_s=${2:?}; shift 2 ;;
    --min-score) min_score=${2:?}; shift 2 ;;
    --only) only+=("${2:?}"); shift 2 ;;
    --catalog) catalog=$(cd "$caller" && realpath "${2:?}"); shift 2 ;;
    --verify) verify=1; shift ;;
    --ref) ref=${2:?}; shift 2 ;;
    -h | --help) usage ;;
    *) echo "mutate.sh: unknown argument $1" >&2; usage ;;
  esac
done

# The catalog: parsing, counting and applying, literally (texts hold parens, quotes, * and &).
helper=$(
  cat <<'PY'
import subprocess, sys

def unescape(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[s[i + 1]])
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)

def load(path):
    entries, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            cols = line.split("\t")
            where = f"{path}:{no}"
            if len(cols) not in (5, 6):
                sys.exit(f"{where}: expected 5 or 6 tab-separated columns, got {len(cols)}")
            mid, file, find, repl, cls = cols[:5]
            equiv = cols[5] if len(cols) == 6 else ""
            if equiv and not equiv.startswith("equivalent:"):
                sys.exit(f"{where}: the 6th column must start with 'equivalent:'")
            if mid in seen:
                sys.exit(f"{where}: duplicate id {mid}")
            if not find:
                sys.exit(f"{where}: empty text to find")
            seen.add(mid)
            entries.append(dict(id=mid, file=file, find=unescape(find), repl=unescape(repl),
                                cls=cls, equiv=equiv[len("equivalent:"):].strip()))
    return entries

def text_of(file, root, ref):
    if ref:
        r = subprocess.run(["git", "show", f"{ref}:{file}"], capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None
    try:
        with open(f"{root}/{file}", encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None

def pick(entries, mid):
    for e in entries:
        if e["id"] == mid:
            return e
    sys.exit(f"unknown mutation id {mid}")

cmd, path = sys.argv[1], sys.argv[2]
entries = load(path)
if cmd == "list":  # id, file, class, equivalent reason; unit-separated (empty fields survive read)
    wanted = sys.argv[3:]
    for mid in wanted:
        pick(entries, mid)
    for e in entries:
        if not wanted or e["id"] in wanted:
            print("\x1f".join([e["id"], e["file"], e["cls"], e["equiv"]]))
elif cmd == "count":  # count ID ROOT: occurrences of the text (-1: no such file)
    e = pick(entries, sys.argv[3])
    t = text_of(e["file"], sys.argv[4], "")
    print(-1 if t is None else t.count(e["find"]))
elif cmd == "apply":  # apply ID ROOT: replaces the one occurrence
    e = pick(entries, sys.argv[3])
    p = f"{sys.argv[4]}/{e['file']}"
    with open(p, encoding="utf-8") as f:
        t = f.read()
    if t.count(e["find"]) != 1:
        sys.exit(f"{e['id']}: the text occurs {t.count(e['find'])} times in {e['file']}")
    with open(p, "w", encoding="utf-8") as f:
        f.write(t.replace(e["find"], e["repl"], 1))
elif cmd == "verify":  # verify ROOT REF: every text exactly once
    root, ref = sys.argv[3], sys.argv[4]
    bad, by_file = 0, {}
    for e in entries:
        t = text_of(e["file"], root, ref)
        n = -1 if t is None else t.count(e["find"])
        by_file[e["file"]] = by_file.get(e["file"], 0) + 1
        if n != 1:
            bad += 1
            why = "no such file" if n < 0 else f"found {n} times"
            print(f"not-applicable  {e['id']}  {e['file']}: {why}")
    for f, n in sorted(by_file.items()):
        print(f"  {n:3d}  {f}")
    where = f"at {ref}" if ref else "in the working tree"
    print(f"{len(entries)} mutations, {len(entries) - bad} applicable {where}, {bad} not applicable")
    sys.exit(1 if bad else 0)
PY
)
catalog_py() { python3 -c "$helper" "$1" "$catalog" "${@:2}"; }

if ((verify)); then
  catalog_py verify "$repo" "$ref"
  exit
fi
[ -z "$ref" ] || { echo "mutate.sh: --ref goes with --verify" >&2; exit 2; }
entries=$(catalog_py list "${only[@]}") || exit 2

dir=${MESHSIM_MUTATE_DIR:-build-mutate}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Inside the repository the scratch directory must be ignored, or it would copy itself.
case "$dir/" in
  "$repo"/*)
    if ! git check-ignore -q "$dir"; then
      echo "mutate.sh: $dir is inside the repository and not ignored by git; add it to .gitignore" >&2
      exit 2
    fi ;;
esac
src=$dir/src
build=$dir/build
logs=$dir/logs
rm -rf "$logs" "$dir/counterexamples" "$dir/orig"
mkdir -p "$src" "$logs" "$dir/counterexamples" "$dir/orig"

now() { echo "${EPOCHREALTIME/,/.}"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# 1. The scratch copy: files whose content changed are copied (with a fresh mtime, so that the
# build sees them as newer than their objects); unchanged files are left alone; files gone from
# the tree are removed.
# The tree as copied (the report names it; the working tree may move on while the run goes).
tree_at="$(git rev-parse --short HEAD 2>/dev/null || echo '(no commit)')$(git diff --quiet HEAD 2>/dev/null || echo ' with local changes')"
echo "== scratch copy: $src ($tree_at)"
copied=0
declare -A listed=()
while IFS= read -r -d '' f; do
  [ -e "$f" ] || continue  # tracked but deleted in the working tree
  listed["$f"]=1
  if ! cmp -s "$f" "$src/$f"; then
    mkdir -p "$(dirname "$src/$f")"
    cp "$f" "$src/$f"
    copied=$((copied + 1))
  fi
done < <(git ls-files -co --exclude-standard -z)
removed=0
while IFS= read -r -d '' f; do
  f=${f#"$src"/}
  if [ -z "${listed[$f]:-}" ]; then
    rm -f "$src/$f"
    removed=$((removed + 1))
  fi
done < <(find "$src" -type f -print0)
echo "   ${#listed[@]} files, $copied copied, $removed removed"

# 2. The baseline: configure once, build meshsim, and the check must pass.
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$logs/configure.log" 2>&1 || {
  echo "mutate.sh: configuring the scratch build failed: $logs/configure.log" >&2
  exit 2
}
meshsim=$build/cli/meshsim
check() { (cd "$dir" && "$meshsim" check --seed "$seed" --cases "$cases" --out "$dir/counterexamples/$1"); }

echo "== baseline build (-j$jobs)"
t0=$(now)
if ! cmake --build "$build" -j"$jobs" --target meshsim >"$logs/baseline.build.log" 2>&1; then
  echo "mutate.sh: the baseline does not build: $logs/baseline.build.log" >&2
  exit 2
fi
baseline_build=$(since "$t0")
echo "   ${baseline_build} s"
echo "== baseline: meshsim check --seed $seed --cases $cases"
t0=$(now)
rc=0
check baseline >"$logs/baseline.check.log" 2>&1 || rc=$?
baseline_check=$(since "$t0")
if [ "$rc" -ne 0 ]; then
  echo "mutate.sh: the baseline check fails (exit $rc); fix the tree first: $logs/baseline.check.log" >&2
  grep '^  FAIL' "$logs/baseline.check.log" >&2 || true
  exit 2
fi
echo "   passes, ${baseline_check} s"
if [ -z "$timeout_s" ]; then
  timeout_s=$(awk -v b="$baseline_check" 'BEGIN { t = int(10 * b + 1); print (t < 60 ? 60 : t) }')
fi

# 3. The mutations. A mutated file is restored from its copy in orig/ whatever happens (the copy
# gets a fresh mtime, so the next build recompiles it).
mutated=""
restore() {
  if [ -n "$mutated" ]; then
    cp "$dir/orig/$mutated" "$src/$mutated"
    mutated=""
  fi
}
trap restore EXIT
trap 'restore; echo; echo "mutate.sh: interrupted" >&2; exit 130' INT TERM

rows=()
total=0 killed=0 timeouts=0 survived=0 equivalent=0 stillborn=0 na=0 errors=0
count=$(printf '%s\n' "$entries" | grep -c .)
echo "== $count mutations (check timeout ${timeout_s} s)"
i=0
while IFS=$'\x1f' read -r -u 3 id file class equiv; do
  i=$((i + 1))
  total=$((total + 1))
  outcome="" props="" build_s="" check_s=""
  n=$(catalog_py count "$id" "$src")
  if [ "$n" != 1 ]; then
    outcome="not-applicable"
    props=$([ "$n" -lt 0 ] && echo "no such file" || echo "found $n times")
    na=$((na + 1))
  else
    mkdir -p "$(dirname "$dir/orig/$file")"
    cp -p "$src/$file" "$dir/orig/$file"
    mutated=$file
    catalog_py apply "$id" "$src"
    t0=$(now)
    if ! cmake --build "$build" -j"$jobs" --target meshsim >"$logs/$id.build.log" 2>&1; then
      build_s=$(since "$t0")
      outcome="stillborn"
      props="build log: logs/$id.build.log"
      stillborn=$((stillborn + 1))
    else
      build_s=$(since "$t0")
      t0=$(now)
      rc=0
      (cd "$dir" && timeout --kill-after=10 "$timeout_s" "$meshsim" check --seed "$seed" --cases "$cases" \
        --out "$dir/counterexamples/$id") >"$logs/$id.check.log" 2>&1 || rc=$?
      check_s=$(since "$t0")
      props=$(sed -n 's/^  FAIL  \([^ ]*\).*/\1/p; s/^  GAVE UP  \([^ ]*\).*/\1 (gave up)/p' "$logs/$id.check.log" |
        paste -sd, - | sed 's/,/, /g')
      case "$rc" in
        0)
          if [ -n "$equiv" ]; then outcome="equivalent"; props="$equiv"; equivalent=$((equivalent + 1))
          else outcome="survived"; survived=$((survived + 1)); fi ;;
        1)
          outcome="killed"
          [ -n "$equiv" ] && outcome="killed (marked equivalent)"
          killed=$((killed + 1)) ;;
        124 | 137)
          outcome="timeout"
          props="no result in ${timeout_s} s"
          timeouts=$((timeouts + 1)) ;;
        *)
          outcome="error (exit $rc)"
          props="check log: logs/$id.check.log"
          errors=$((errors + 1)) ;;
      esac
    fi
    restore
  fi
  printf '[%2d/%d] %-40s %-16s build %6s s  check %6s s  %s\n' "$i" "$count" "$id" "$outcome" \
    "${build_s:--}" "${check_s:--}" "$props"
  rows+=("| $id | $class | $file | $outcome | ${props//|/\\|} | ${build_s:--} | ${check_s:--} |")
done 3<<<"$entries"

# 4. The report.
scored=$((total - equivalent - stillborn - na))
score=$(awk -v k=$((killed + timeouts)) -v s=$scored 'BEGIN { if (s > 0) printf "%.1f", 100 * k / s; else print "n/a" }')
report=$dir/report.md
{
  echo "# Mutation score of meshsim check"
  echo
  echo "Command: \`$command_line\`${MESHSIM_MUTATE_DIR:+ (MESHSIM_MUTATE_DIR=$MESHSIM_MUTATE_DIR)}"
  echo
  echo "Each mutation: \`meshsim check --seed $seed --cases $cases\` under a ${timeout_s} s timeout;" \
    "baseline build ${baseline_build} s, baseline check ${baseline_check} s; tree at" \
    "$tree_at."
  echo
  echo "| id | class | file | outcome | failing properties | build s | check s |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "total $total: killed $killed, timeout $timeouts, survived $survived, error $errors," \
    "equivalent $equivalent, stillborn $stillborn, not-applicable $na"
  echo
  echo "**score: $score%** = (killed + timeout) / (total - equivalent - stillborn - not-applicable)" \
    "= $((killed + timeouts)) / $scored (threshold $min_score%)"
} >"$report"
echo
cat "$report"
echo
echo "report: $report"
[ "$score" != "n/a" ] && awk -v s="$score" -v m="$min_score" 'BEGIN { exit !(s >= m) }'
