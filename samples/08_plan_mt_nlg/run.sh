#!/bin/sh
# Plans MT-NLG 530B on 280 DGX A100 nodes with weft-plan: the published layout simulated, then
# every layout searched, ranked and explained. Exits non-zero if weft-plan fails or the
# published mesh (TP 8, PP 35, DP 8) falls out of the search's top 5.
#
#   samples/08_plan_mt_nlg/run.sh [path/to/weft-plan]    (default: build/tools/plan/weft-plan,
#                                                          then weft-plan on PATH)
set -eu
plan="${1:-}"
if [ -z "$plan" ]; then
  if [ -x build/tools/plan/weft-plan ]; then plan=build/tools/plan/weft-plan; else plan=weft-plan; fi
fi
command -v "$plan" >/dev/null 2>&1 || {
  echo "run.sh: no weft-plan at '$plan': build it (cmake --build build --target weft-plan) or pass its path" >&2
  exit 1
}
mtnlg="--model mt-nlg-530b --gpu a100-80gb --nodes 280 --global-batch 1920"

echo "\$ weft-plan $mtnlg --tp 8 --pp 35 --micro-batch 2 --recompute full --grad-accum fp16 --engine deepspeed"
# shellcheck disable=SC2086 # $mtnlg is a list of arguments
"$plan" $mtnlg --tp 8 --pp 35 --micro-batch 2 --recompute full --grad-accum fp16 --engine deepspeed
echo
echo "\$ weft-plan $mtnlg --search --tp 8 --pp 35"
# shellcheck disable=SC2086
search="$("$plan" $mtnlg --search --tp 8 --pp 35)"
echo "$search"
rank="$(echo "$search" | sed -n 's/^The layout tp 8 pp 35 dp 8 ranks #\([0-9]*\) of.*/\1/p')"
if [ -z "$rank" ] || [ "$rank" -gt 5 ]; then
  echo "run.sh: the published layout (tp 8 pp 35 dp 8) is not in the top 5 (rank '${rank:-none}')" >&2
  exit 1
fi
