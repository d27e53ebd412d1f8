#!/usr/bin/env bash
# The soft NIC through SignaledQueue beside the yardstick: the simplest two-thread software
# NIC (../shared/ceiling, see its README: a 64-byte WQE ring, memcpy, no checks), run right
# before `selsig bench` on this machine, in rounds, so that each round's ratio compares
# figures of one minute of one machine.
#
#   scripts/bench-yardstick.sh [-r ROUNDS] [-c CEILING_DIR] [-- SELSIG_BENCH_ARGS...]
#
# Each round: the yardstick signaling every 64th and every WRITE (64 B, 20 million WRITEs
# each), then `selsig bench -s 64 -e 1,64 --no-nic-times -D 1` with the given arguments
# (default `-t 8192 -l 512`: the queue depth and post list at which the soft NIC streams).
# Prints both, and the ratio selsig / yardstick at each interval. Defaults: 3 rounds, the
# yardstick in ../shared/ceiling (copied into target/ceiling and built there).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

rounds=3 ceiling=../shared/ceiling
while getopts "r:c:h" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    c) ceiling=$OPTARG ;;
    *) sed -n 2,13p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = -- ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-t 8192 -l 512)

if [ ! -f "$ceiling/Cargo.toml" ]; then
  echo "no yardstick at $ceiling (give its folder with -c)" >&2
  exit 2
fi
rm -rf target/ceiling
mkdir -p target
cp -r "$ceiling" target/ceiling
chmod -R u+w target/ceiling
(cd target/ceiling && cargo build --release -q)
cargo build --release -q -p selsig-cli
yard=target/ceiling/target/release/ceiling
selsig=target/release/selsig

for round in $(seq "$rounds"); do
  echo "== round $round"
  y64=$("$yard" 64 64)
  y1=$("$yard" 1 64)
  echo "yardstick: $y64"
  echo "yardstick: $y1"
  out=$("$selsig" bench -s 64 -e 1,64 --no-nic-times -D 1 "${args[@]}" 2>&1)
  echo "$out" | grep -E '^ +64B'
  # Mops/s of the yardstick's line, M WR/s of the bench's row.
  rate() { awk '{for (i = 1; i <= NF; i++) if ($i == "Mops/s") print $(i - 1)}'; }
  row() { echo "$out" | awk -v e="every:$1" '$1 == "64B" && $2 == e {print $3}'; }
  awk -v s64="$(row 64)" -v y64="$(echo "$y64" | rate)" -v s1="$(row 1)" -v y1="$(echo "$y1" | rate)" \
    'BEGIN {printf "selsig / yardstick: every 64 %.2fx, every 1 %.2fx; selsig every 64 / every 1 %.2fx\n", s64 / y64, s1 / y1, s64 / s1}'
done
