#!/usr/bin/env bash
# Runs the software NIC's multi-threaded stress test under valgrind's memcheck, with a
# small number of work requests (valgrind runs threads one at a time, slowly), then a small
# `selsig bench` (the driver, the bench's own loop and clock readings). Any error valgrind
# reports fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind-stress: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
bin=$(cargo test -q -p selsig-soft --test stress --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "valgrind-stress: could not build the stress test" >&2; exit 1; }
export SELSIG_STRESS_WRS=${SELSIG_STRESS_WRS:-10000}
echo "valgrind-stress: $bin, $SELSIG_STRESS_WRS work requests per thread" >&2
vg=(valgrind --quiet --fair-sched=yes --error-exitcode=99 --leak-check=full --show-possibly-lost=no --errors-for-leak-kinds=definite)
"${vg[@]}" "$bin" --test-threads=1
cargo build -q --release -p selsig-cli
echo "valgrind-stress: selsig bench, 2000 WRITEs per point" >&2
"${vg[@]}" target/release/selsig bench --provider soft -s 64 -e 1,16 -n 2000 -t 16 >/dev/null
