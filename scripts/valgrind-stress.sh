#!/usr/bin/env bash
# Runs the software NIC's multi-threaded stress test under valgrind's memcheck, with a
# small number of work requests (valgrind runs threads one at a time, slowly), then a small
# `selsig bench` (the driver, the bench's own loop and clock readings). Any error valgrind
# reports fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
command -v valgrind >/dev/null || { echo "valgrind-stress: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
# (json-render-diagnostics: cargo renders compiler errors on stderr, not inside the JSON on
# stdout; its exit code is checked apart from the pipeline's.)
json=$(cargo test -q -p selsig-soft --test stress --no-run --message-format=json-render-diagnostics) \
  || { echo "valgrind-stress: could not build the stress test" >&2; exit 1; }
bin=$(sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' <<< "$json" | tail -n 1)
[ -x "$bin" ] || { echo "valgrind-stress: could not build the stress test" >&2; exit 1; }
export SELSIG_STRESS_WRS=${SELSIG_STRESS_WRS:-10000}
echo "valgrind-stress: $bin, $SELSIG_STRESS_WRS work requests per thread" >&2
vg=(valgrind --quiet --fair-sched=yes --error-exitcode=99 --leak-check=full --show-possibly-lost=no --errors-for-leak-kinds=definite)
"${vg[@]}" "$bin" --test-threads=1
# The binary cargo built, wherever the target directory is (CARGO_TARGET_DIR, a config).
json=$(cargo build -q --release -p selsig-cli --message-format=json-render-diagnostics) \
  || { echo "valgrind-stress: could not build selsig" >&2; exit 1; }
sel=$(sed -n 's/.*"executable":"\([^"]*\/selsig\)".*/\1/p' <<< "$json" | tail -n 1)
[ -x "$sel" ] || { echo "valgrind-stress: could not build selsig" >&2; exit 1; }
echo "valgrind-stress: selsig bench, 2000 WRITEs per point" >&2
"${vg[@]}" "$sel" bench --provider soft -s 64 -e 1,16 -n 2000 -t 16 >/dev/null
