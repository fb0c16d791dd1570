#!/usr/bin/env bash
# One table-driven test of a tool's bad command lines (DESIGN.md, "Tables of bad inputs"):
#
#   bad_args.sh TABLE TOOL [ARG...]
#
# TABLE has one row per bad command line, `EXIT | TEXT | ARGS` (blank lines and lines starting
# with # are skipped): the tool, started as TOOL ARG... ARGS (ARGS split at spaces; @VAR@ is
# replaced by the environment variable VAR, e.g. @EMU_LIB@), must exit with EXIT within 60 s and
# print TEXT (a fixed string, not a pattern) on stdout or stderr. A row that exits otherwise, is
# killed by a signal or a sanitizer, prints `terminate called`, or runs out of time fails the test.
# Every row is run (one failure does not hide the next) and the last line counts them:
# "N tried: N clear errors, N crashes, N hangs, N other".
set -u
table=$1 tool=$2
shift 2
prefix=("$@")
work=$(mktemp -d /tmp/tbverbs-bad-args-XXXXXX)
trap 'rm -rf "$work"' EXIT
tried=0 clear=0 crashes=0 hangs=0 other=0
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in '' | '#'*) continue ;; esac
  want_exit=$(sed -E 's/^ *([^|]*[^| ]) *\|.*$/\1/' <<<"$line")
  want_text=$(sed -E 's/^[^|]*\| *(.*[^ ]) *\|[^|]*$/\1/' <<<"$line")
  args=$(sed -E 's/^.*\| *//' <<<"$line")
  while [[ $args =~ @([A-Z_][A-Z0-9_]*)@ ]]; do
    var=${BASH_REMATCH[1]}
    args=${args//@$var@/${!var:-}}
  done
  read -r -a argv <<<"$args"
  tried=$((tried + 1))
  out=$work/out.txt
  timeout 60 "$tool" "${prefix[@]}" "${argv[@]}" >"$out" 2>&1
  rc=$?
  verdict=""
  if [ $rc -eq 124 ]; then
    hangs=$((hangs + 1)); verdict="HANG (no exit within 60 s)"
  elif [ $rc -gt 128 ] || grep -Eq "terminate called|Segmentation fault|runtime error:|ERROR: AddressSanitizer|ERROR: LeakSanitizer" "$out"; then
    crashes=$((crashes + 1)); verdict="CRASH (exit $rc)"
  elif [ "$rc" != "$want_exit" ]; then
    other=$((other + 1)); verdict="WRONG EXIT $rc (expected $want_exit)"
  elif ! grep -Fq -- "$want_text" "$out"; then
    other=$((other + 1)); verdict="NO CLEAR ERROR (expected the text: $want_text)"
  fi
  if [ -z "$verdict" ]; then
    clear=$((clear + 1))
    echo "ok: exit $rc, \"$want_text\": $args"
  else
    echo "FAIL: $verdict: $args"
    sed 's/^/    | /' "$out" | head -20
  fi
done <"$table"
echo "$tried tried: $clear clear errors, $crashes crashes, $hangs hangs, $other other"
[ "$tried" -gt 0 ] && [ "$clear" -eq "$tried" ]
