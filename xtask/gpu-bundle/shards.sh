#!/usr/bin/env bash
# Every test binary of the bundle through run.sh in SHARDS processes at once
# (round robin, each unpacking the payload into a folder of its own), e.g.
# under memcheck, which then covers all 146 binaries in about two minutes on
# one GPU instead of ten. Tests that watch timing or the whole device's
# memory can fail when they share the GPU this way; the sanitizer's
# ERROR SUMMARY of each binary is what this run is for.
#
# usage: bash target/gpu-bundle/shards.sh LOG_DIR SHARDS [run.sh options]
#   e.g. bash target/gpu-bundle/shards.sh $OUT/mc 8 --sanitize --no-bench --no-doctests
# Environment: PRIORITY (a regex: those binaries first in each shard),
# MC_SECONDS (each shard's time limit), TEST_TIMEOUT (run.sh's, per binary).
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
logs="${1:?usage: shards.sh LOG_DIR SHARDS [run.sh options]}"
shards="${2:?shards}"
shift 2
mkdir -p "$logs"
names=$(tar -tJf "$here/payload.tar.xz" | sed -n 's#^\(\./\)\{0,1\}tests/\([^/]\+\)$#\2#p' | sort)
if [ -n "${PRIORITY:-}" ]; then
  names=$( (echo "$names" | grep -E -- "$PRIORITY"; echo "$names" | grep -Ev -- "$PRIORITY") )
fi
echo "$names" | wc -l > "$logs/count.txt"
for s in $(seq 0 $((shards - 1))); do
  pick=$(echo "$names" | awk -v s="$s" -v n="$shards" 'NR % n == s' | paste -sd'|')
  [ -n "$pick" ] || continue
  mkdir -p "${TMPDIR:-/tmp}/shard$s"
  TMPDIR="${TMPDIR:-/tmp}/shard$s" timeout -s KILL "${MC_SECONDS:-100000}" \
    bash "$here/run.sh" "$logs/shard$s" --only "^($pick)\$" "$@" > "$logs/shard$s.out" 2>&1 &
done
wait
cat "$logs"/shard*/summary.txt | grep -v '^gpu:\|^bundle:\|^cli ' | sort > "$logs/all.txt"
echo "binaries: $(cat "$logs/count.txt"), ran: $(grep -c '^ok \|^FAIL' "$logs/all.txt"), sanitizer clean: $(grep -c 'ERROR SUMMARY: 0 errors' "$logs/all.txt")"
grep -v 'ERROR SUMMARY: 0 errors' "$logs/all.txt" | head -40
