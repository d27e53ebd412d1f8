#!/usr/bin/env bash
# Runs the fuzz targets of fuzz/ with libFuzzer, with no cargo-fuzz and no nightly toolchain:
# builds them with the coverage instrumentation cargo-fuzz adds (and debug assertions and
# overflow checks; no sanitizer: the code they exercise has no `unsafe`), then runs each for
# SECONDS. Corpora are kept in fuzz/corpus/<target> (the scenario target starts from the
# shipped scenarios); an input that fails is written to fuzz/artifacts/<target>/, and the
# script fails with it.
#
#   scripts/fuzz.sh [SECONDS [TARGET...]]     default: 60 s, every target (tracker, scenario,
#                                             handshake)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(tracker scenario handshake)
case "$seconds" in ''|*[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, not '$seconds'" >&2; exit 2;; esac

# The instrumentation applies to the targets' code only: with --target, build scripts and
# proc macros are built for the host without it (they would not link with it).
host=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
cargo build --quiet --release --manifest-path fuzz/Cargo.toml --target "$host" \
  --target-dir target/fuzz --bins

for t in "${targets[@]}"; do
  bin="target/fuzz/$host/release/$t"
  [ -x "$bin" ] || { echo "fuzz.sh: no target '$t' (fuzz/Cargo.toml names them)" >&2; exit 2; }
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  seeds=()
  [ "$t" = scenario ] && seeds=(scenarios)
  echo "fuzz.sh: $t for $seconds s" >&2
  # libFuzzer's own output is long: its last lines say what happened (and, on a failure, the
  # input that failed).
  log=$(mktemp)
  if ! "$bin" -max_total_time="$seconds" -print_final_stats=1 \
      -artifact_prefix="fuzz/artifacts/$t/" "fuzz/corpus/$t" "${seeds[@]}" > "$log" 2>&1; then
    tail -n 60 "$log" >&2
    rm -f "$log"
    echo "fuzz.sh: $t failed; the input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  grep -E '^Done|stat::number_of_executed_units' "$log" >&2 || true
  rm -f "$log"
done
