#!/usr/bin/env bash
# The GPU test bundle made by `cargo xtask gpu-bundle`: every test binary, the
# doc tests, the benches and the CLI, run on the real driver (CUDA_STREAMS_DRIVER=cuda).
#
# usage: bash target/gpu-bundle/run.sh LOG_DIR [options]
#   --sanitize[=TOOL]   run the test and doc-test binaries under compute-sanitizer
#                       (default memcheck); API errors are not reported, since tests
#                       provoke them on purpose (out of memory, zero sizes, unknown kernels)
#   --only REGEX        only the test/doc-test/bench binaries whose name matches
#   --no-tests          skip the test binaries
#   --no-doctests       skip the doc tests
#   --no-bench          skip the benches
#   --bench-args "..."  extra arguments for every bench binary (e.g. "--warm-up-time 1")
#   --cli "..."         extra CLI runs, `;`-separated, e.g. "demo;bench"
#   --parallel          run each binary's tests in parallel, as `cargo test` does
#                       (by default they run one at a time here: see below)
#   --driver NAME       CUDA_STREAMS_DRIVER for everything (default cuda; `soft` runs the
#                       bundle on the software driver, on a machine without a GPU)
# Environment: TEST_TIMEOUT / DOCTEST_TIMEOUT, seconds per binary (defaults below).
# Full logs go to LOG_DIR; a short summary is printed last. Nothing here needs the
# source tree: run it from anywhere.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
logs="${1:?usage: run.sh LOG_DIR [--sanitize[=TOOL]] [--only REGEX] [--no-tests] [--no-bench]}"
shift
# What this run was asked for, for `cargo xtask bench-report --from LOG_DIR`.
invocation="bash target/gpu-bundle/run.sh <log dir>"
for arg in "$@"; do
  case "$arg" in *" "*) invocation="$invocation \"$arg\"" ;; *) invocation="$invocation $arg" ;; esac
done
sanitize=""; only="."; run_tests=1; run_doctests=1; run_bench=1; bench_args=""; cli_runs="info"
driver=cuda
# On a GPU, cuMemFree, cuMemFreeHost, cuModuleUnload and stream teardown can
# hold every other thread's driver calls until the whole device is idle. Tests
# of one binary running side by side then disturb each other: one that asserts
# a stream is still busy sees its kernel finish while a neighbour's free held
# it up, or waits out a neighbour's gate. Each test makes its own threads where
# it tests concurrency, so the binaries run their tests one at a time here.
test_threads="--test-threads=1"
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=memcheck ;;
    --sanitize=*) sanitize="${1#*=}" ;;
    --only) only="$2"; shift ;;
    --no-tests) run_tests=0 ;;
    --no-doctests) run_doctests=0 ;;
    --driver) driver="$2"; shift ;;
    --no-bench) run_bench=0 ;;
    --bench-args) bench_args="$2"; shift ;;
    --cli) cli_runs="info;$2"; shift ;;
    --parallel) test_threads="" ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$logs"
echo "$invocation" > "$logs/command.txt"
# The binaries travel compressed (the device tool carries at most 64 MiB).
if [ -f "$here/payload.tar.xz" ]; then
  unpacked="${TMPDIR:-/tmp}/cuda-streams-bundle"
  rm -rf "$unpacked" && mkdir -p "$unpacked"
  tar -xJf "$here/payload.tar.xz" -C "$unpacked" || { echo "run.sh: cannot unpack the payload" >&2; exit 2; }
  here="$unpacked"
fi
export CUDA_STREAMS_DRIVER="$driver"
# NCCL is loaded only once NVLink SHARP is chosen; off unless the caller chose.
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
# Tests whose premise a sanitizer's instrumentation changes skip, saying so.
export CUDA_STREAMS_SANITIZER="$sanitize"
# The facade's `examples` test runs the example binaries from here.
export CUDA_STREAMS_EXAMPLES_DIR="$here/examples"
export PATH="/usr/local/cuda/bin:$PATH"
summary="$logs/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary" >/dev/null; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$logs/gpu.txt" 2>&1
note "gpu: $(head -n1 "$logs/gpu.txt")"
note "bundle: $(cat "$here/MANIFEST" 2>/dev/null | head -n1)"

IFS=';' read -r -a clis <<< "$cli_runs"
for c in "${clis[@]}"; do
  [ -n "$c" ] || continue
  log="$logs/cli-${c// /_}.log"
  # shellcheck disable=SC2086
  (cd "$logs" && "$here/bin/cuda-streams" $c) > "$log" 2>&1
  note "cli $c: exit $?"
done

passed=0; failed=0; ignored=0; bad_binaries=()
if [ "$run_tests" = 1 ]; then
  for t in "$here"/tests/*; do
    name="$(basename "$t")"
    echo "$name" | grep -Eq -- "$only" || continue
    log="$logs/test-$name.log"
    # A hung binary must not eat the whole GPU session: each gets a time limit.
    if [ -n "$sanitize" ]; then
      cmd=(timeout -s KILL "${TEST_TIMEOUT:-300}" compute-sanitizer --tool "$sanitize" --report-api-errors no --require-cuda-init no --target-processes all --error-exitcode 97 --print-limit 100 "$t" $test_threads)
    else
      cmd=(timeout -s KILL "${TEST_TIMEOUT:-120}" "$t" $test_threads)
    fi
    start=$(date +%s%N)
    "${cmd[@]}" > "$log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    p=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
    f=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
    i=$(grep -Eo '[0-9]+ ignored' "$log" | awk '{s+=$1} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); ignored=$((ignored + i))
    extra=""
    if [ -n "$sanitize" ]; then extra=" | $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -n1)"; fi
    if [ "$rc" != 0 ]; then
      bad_binaries+=("$name")
      [ "$f" = 0 ] && failed=$((failed + 1))
      note "FAIL  $name: exit $rc, $p passed, $f failed (${ms} ms)$extra"
      grep -E '^test .* FAILED$|panicked at|^---- ' "$log" | head -n 20 | sed 's/^/        /' >> "$summary"
    else
      note "ok    $name: $p passed, $i ignored (${ms} ms)$extra"
    fi
  done
fi

# Doc tests: the binaries rustdoc kept (xtask/src/doctests.rs). A merged one
# (`<package>.merged_doctest_*`) holds all of a crate's doc tests and ignores its
# command line: RUSTDOC_DOCTEST_BIN_PATH makes it run each in a child process of
# its own, as `cargo test --doc` does, and RUST_TEST_THREADS sets how many at
# once. Any other is one doc test, a plain program (`*.should_panic`: must fail).
# Each runs in an empty folder of its own, as a user's program would.
dpassed=0; dfailed=0; dignored=0
if [ "$run_doctests" = 1 ] && [ -d "$here/doctests" ]; then
  doctest_threads=1
  [ -z "$test_threads" ] && doctest_threads=""
  for t in "$here"/doctests/*; do
    name="$(basename "$t")"
    echo "$name" | grep -Eq -- "$only" || continue
    log="$logs/doctest-$name.log"
    work="$(mktemp -d "${TMPDIR:-/tmp}/cuda-streams-doctest.XXXXXX")"
    if [ -n "$sanitize" ]; then
      cmd=(timeout -s KILL "${DOCTEST_TIMEOUT:-900}" compute-sanitizer --tool "$sanitize" --report-api-errors no --require-cuda-init no --target-processes all --error-exitcode 97 --print-limit 100 "$t")
    else
      cmd=(timeout -s KILL "${DOCTEST_TIMEOUT:-300}" "$t")
    fi
    start=$(date +%s%N)
    (cd "$work" && RUSTDOC_DOCTEST_BIN_PATH="$t" RUST_TEST_THREADS="${doctest_threads:-$(nproc)}" "${cmd[@]}") > "$log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    rm -rf "$work"
    extra=""
    if [ -n "$sanitize" ]; then extra=" | $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -n1)"; fi
    case "$name" in
      *.merged_doctest_*)
        p=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
        f=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
        i=$(grep -Eo '[0-9]+ ignored' "$log" | awk '{s+=$1} END {print s+0}')
        ;;
      *.should_panic)
        # Must fail by panicking (101), not by a signal, a time limit or the sanitizer.
        if [ "$rc" = 101 ]; then rc=0; p=1; f=0; else rc=1; p=0; f=1; fi; i=0 ;;
      *)
        if [ "$rc" = 0 ]; then p=1; f=0; else p=0; f=1; fi; i=0 ;;
    esac
    dpassed=$((dpassed + p)); dfailed=$((dfailed + f)); dignored=$((dignored + i))
    if [ "$rc" != 0 ]; then
      bad_binaries+=("doctest $name")
      [ "$f" = 0 ] && dfailed=$((dfailed + 1))
      note "FAIL  doctest $name: exit $rc, $p passed, $f failed (${ms} ms)$extra"
      grep -E '^test .* FAILED$|panicked at|^---- ' "$log" | head -n 20 | sed 's/^/        /' >> "$summary"
    else
      note "ok    doctest $name: $p passed, $i ignored (${ms} ms)$extra"
    fi
  done
  note "doc tests: $dpassed passed, $dfailed failed, $dignored skipped"
fi

if [ "$run_bench" = 1 ] && [ -d "$here/benches" ]; then
  for b in "$here"/benches/*; do
    name="$(basename "$b")"
    echo "$name" | grep -Eq -- "$only" || continue
    log="$logs/bench-$name.log"
    # shellcheck disable=SC2086
    "$b" --bench $bench_args > "$log" 2>&1
    note "bench $name: exit $?"
    grep -E '^(RATIO|ratio|FIGURE)' "$log" | sed 's/^/        /' >> "$summary"
  done
fi

echo
cat "$summary"
echo
echo "logs: $logs"
echo "tests: $passed passed, $failed failed, $ignored skipped"
echo "doc tests: $dpassed passed, $dfailed failed, $dignored skipped"
[ "${#bad_binaries[@]}" = 0 ]
