#!/usr/bin/env bash
# A/B benches in one call: each named bench of this bundle, then the same bench
# built at an earlier commit, alternating, so that both see the same machine
# state. Prints every FIGURE and RATIO line of both.
#
# The earlier build goes beside this script as base-benches.tar.xz, made by
# hand (xtask does not make it): in a worktree of the earlier commit,
#   cargo bench -p cuda-streams-benches --no-run --message-format=json --bench NAME...
# then copy each bench executable the JSON names to benches/NAME (stripped),
# write a first line "base <commit>" to MANIFEST, and
#   tar -cJf target/gpu-bundle/base-benches.tar.xz -C <that folder> .
# (A worktree building into this checkout's target folder overwrites the
# cuda-sys artifacts there; `cargo clean --release -p cuda-streams-sys` after.)
#
# usage: bash target/gpu-bundle/ab.sh LOG_DIR ROUNDS "bench names" [bench args...]
#   e.g. bash target/gpu-bundle/ab.sh $OUT/logs 2 "ordering launch programs"
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
logs="${1:?usage: ab.sh LOG_DIR ROUNDS NAMES [bench args]}"
rounds="${2:?rounds}"
names="${3:?bench names}"
shift 3
mkdir -p "$logs"
export CUDA_STREAMS_DRIVER="${CUDA_STREAMS_DRIVER:-cuda}"
# NVLink multicast stays off on the shared hosts (the collectives refuse to
# load NCCL without a choice made here).
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
ours="${TMPDIR:-/tmp}/cuda-streams-bundle"
if [ ! -d "$ours/benches" ]; then
  rm -rf "$ours" && mkdir -p "$ours"
  tar -xJf "$here/payload.tar.xz" -C "$ours" || { echo "ab.sh: cannot unpack the payload" >&2; exit 2; }
fi
base="${TMPDIR:-/tmp}/cuda-streams-base"
rm -rf "$base" && mkdir -p "$base"
tar -xJf "$here/base-benches.tar.xz" -C "$base" || { echo "ab.sh: no base-benches.tar.xz" >&2; exit 2; }
summary="$logs/ab-summary.txt"
{
  echo "ours: $(head -n1 "$ours/MANIFEST")"
  echo "base: $(head -n1 "$base/MANIFEST")"
  nvidia-smi --query-gpu=name --format=csv,noheader | head -n1
} >> "$summary"
for round in $(seq 1 "$rounds"); do
  for name in $names; do
    for side in ours base; do
      dir="$ours/benches"; [ "$side" = base ] && dir="$base/benches"
      bin="$dir/$name"
      [ -x "$bin" ] || { echo "round $round $side $name: missing" >> "$summary"; continue; }
      log="$logs/ab-$round-$side-$name.log"
      "$bin" --bench "$@" > "$log" 2>&1
      echo "round $round $side $name: exit $?" >> "$summary"
      grep -E '^(RATIO|ratio|FIGURE)' "$log" | sed "s/^/  $side  /" >> "$summary"
    done
  done
done
cat "$summary"
