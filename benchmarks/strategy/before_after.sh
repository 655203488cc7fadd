#!/usr/bin/env bash
# The 3D trainer's tokens/s at another revision's headers beside the working tree's, in one run:
# benchmarks/strategy/train_bench.cpp (this tree's) is compiled twice with the flags of the
# project's Release benchmarks (CMake's Release -O3 -DNDEBUG, C++20 with GNU extensions, OpenBLAS
# at one thread per rank, Google Benchmark), once against REV's include/ and once against the
# working tree's, and the two programs run the demo row in turns (before, after; then after,
# before; ...). Prints every run's tokens/s (its median step; best: its fastest step) and the
# after/before ratio of their medians over the runs.
#
#   benchmarks/strategy/before_after.sh [REV]         REV defaults to 904c458
#
# Environment: ROUNDS (default 3: runs of each program), FILTER (the row, default
# ^demo/zero1/), CXX (default c++), WEFT_BENCH_TRAIN=small (a smoke run), WAIT_LOAD (e.g. 1.0:
# after compiling, wait up to 20 minutes for the 1-minute load average to fall below it). The
# load average is printed before the runs (the runs raise it: 8 rank threads each): on a busy
# machine the figures mean nothing.
set -euo pipefail

rev=${1:-904c458}
rounds=${ROUNDS:-3}
filter=${FILTER:-^demo/zero1/}
cxx=${CXX:-c++}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
source_file=$root/benchmarks/strategy/train_bench.cpp

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# REV's headers, without touching the repository's worktrees or index.
mkdir -p "$tmp/before"
git -C "$root" archive "$rev" include | tar -x -C "$tmp/before"

flags=(-std=gnu++20 -O3 -DNDEBUG -DWEFT_OPENBLAS=1 -pthread)
libs=(-lbenchmark -lopenblas)
build() {  # build <include dir> <output>
  echo "compiling against $1" >&2
  "$cxx" "${flags[@]}" -I"$1" "$source_file" -o "$2" "${libs[@]}"
}
build "$tmp/before/include" "$tmp/before_bench"
build "$root/include" "$tmp/after_bench"

# One run of a program: its tokens/s at the row's median step and at its fastest.
tokens_per_s() {
  local out
  out=$("$1" --benchmark_filter="$filter" --benchmark_format=json 2>/dev/null)
  if grep -q '"error_occurred": true' <<<"$out"; then
    echo "error in $1: $(grep -o '"error_message": "[^"]*"' <<<"$out")" >&2
    return 1
  fi
  local median best
  median=$(grep -o '"tokens_per_s": [0-9.eE+-]*' <<<"$out" | head -n 1 | awk '{print $2}')
  best=$(grep -o '"best_tokens_per_s": [0-9.eE+-]*' <<<"$out" | head -n 1 | awk '{print $2}')
  echo "$median ${best:-0}"
}

if [[ -n ${WAIT_LOAD:-} ]]; then
  for ((i = 0; i < 20; i++)); do
    awk -v limit="$WAIT_LOAD" '{exit !($1 < limit)}' /proc/loadavg && break
    sleep 60
  done
fi

echo "row $filter, $rounds runs each; before: $rev, after: the working tree ($(git -C "$root" rev-parse --short HEAD) + changes)"
echo "load average before the runs (1, 5, 15 min): $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-7s %14s %14s\n' run which tokens/s best
before=()
after=()
before_best=()
after_best=()
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2 == 1)); then order=(before after); else order=(after before); fi
  for which in "${order[@]}"; do
    read -r t best < <(tokens_per_s "$tmp/${which}_bench")
    printf '%-6s %-7s %14.0f %14.0f\n' "$r" "$which" "$t" "$best"
    if [[ $which == before ]]; then
      before+=("$t")
      before_best+=("$best")
    else
      after+=("$t")
      after_best+=("$best")
    fi
  done
done

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ratio() {  # ratio <what> <before values...> -- <after values...>
  local what=$1 b a
  shift
  local -a bs=() as=()
  while [[ $1 != -- ]]; do bs+=("$1"); shift; done
  shift
  as=("$@")
  b=$(median "${bs[@]}")
  a=$(median "${as[@]}")
  awk -v w="$what" -v b="$b" -v a="$a" 'BEGIN {printf "%s: before %.0f, after %.0f; after / before = %.3f\n", w, b, a, a / b}'
}
ratio "tokens/s (median of the runs)" "${before[@]}" -- "${after[@]}"
ratio "best tokens/s (median of the runs)" "${before_best[@]}" -- "${after_best[@]}"
