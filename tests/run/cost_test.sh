#!/usr/bin/env bash
# docs/collectives.md's "What a rank costs" table is held to the measurement: every row is run
# (tbverbs-emu run <row's arguments> -- rank_cost <row's program arguments>, TBVERBS_MEMORY=<mode>)
# and rank 0's QP, PD, CQ and MR counts on each of its devices must equal the row's.
# usage: cost_test.sh TBVERBS_EMU RANK_COST docs/collectives.md
set -uo pipefail
EMU=$1 PROG=$2 DOC=$3
OUT=$(mktemp /tmp/tbverbs-cost-test-XXXXXX)
trap 'rm -f "$OUT"' EXIT
rows=$(sed -n '/<!-- cost-table/,/<!-- end of cost-table/p' "$DOC" | grep -E '^\| `-n ')
[ "$(wc -l <<<"$rows")" -ge 5 ] || { echo "FAIL: no cost table rows in $DOC"; exit 1; }
checked=0
while IFS= read -r row; do
  # | `-n 4 --mesh` ... `--register` | `registered` | QPs | PDs | CQs | MRs connected | MRs after | ...
  IFS='|' read -r _ run mode qps pds cqs mrs0 mrs1 _ <<<"$row"
  launch=$(sed -nE 's/^ *`([^`]*)`.*/\1/p' <<<"$run")
  prog=$(sed -nE 's/.*\.\.\. `([^`]*)` *$/\1/p' <<<"$run")
  mode=$(tr -d ' `' <<<"$mode"); qps=$(tr -d ' ' <<<"$qps"); pds=$(tr -d ' ' <<<"$pds"); cqs=$(tr -d ' ' <<<"$cqs")
  mrs0=$(tr -d ' ' <<<"$mrs0"); mrs1=$(tr -d ' ' <<<"$mrs1")
  # shellcheck disable=SC2086
  TBVERBS_MEMORY=$mode "$EMU" run -q $launch -- "$PROG" $prog >"$OUT" 2>&1 || { cat "$OUT"; echo "FAIL: the run failed: $row"; exit 1; }
  for when in connected after_call; do
    want_mrs=$mrs0; [ $when = after_call ] && want_mrs=$mrs1
    lines=$(grep -E "^\[rank 0\] cost: $when " "$OUT")
    [ -n "$lines" ] || { cat "$OUT"; echo "FAIL: no counts ($when) for: $row"; exit 1; }
    while IFS= read -r l; do
      got=$(sed -E 's/.* (qps=[0-9]+ pds=[0-9]+ cqs=[0-9]+ mrs=[0-9]+)$/\1/' <<<"$l")
      want="qps=$qps pds=$pds cqs=$cqs mrs=$want_mrs"
      [ "$got" = "$want" ] || { echo "FAIL: $row: $when: measured $got, the table says $want ($l)"; exit 1; }
    done <<<"$lines"
  done
  echo "ok: $launch ${prog:+(rank_cost $prog) }TBVERBS_MEMORY=$mode: qps=$qps pds=$pds cqs=$cqs mrs=$mrs0 then $mrs1 per device; $(grep -h '^\[rank 0\] cost: rss_mb' "$OUT" | sed 's/^\[rank 0\] cost: //')"
  checked=$((checked + 1))
done <<<"$rows"
echo "ok: $checked rows of the cost table hold"
