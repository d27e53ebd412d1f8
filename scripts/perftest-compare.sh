#!/usr/bin/env bash
# Compares `selsig bench` in its perftest-compatible mode with perftest's ib_write_bw on the
# same device: the kernel's Soft-RoCE (rxe0) inside the project's VM (scripts/rxe-vm).
#
#   scripts/perftest-compare.sh [-c] [-o [-G]] [-q QPS] [-Q CQ_MOD] [-t TX_DEPTH] [-n ITERS] [-r REPEATS] [SIZE...]
#
# For each size both run the same WRITE stream (one WRITE per post, every CQ_MOD-th signaled
# and the last, at most TX_DEPTH outstanding, ITERS WRITEs on each of QPS queue pairs) and
# report perftest's "BW average[MB/sec]" (MB = 2^20 bytes, first post to last completion).
# They run alternately, REPEATS times each (order flipped every round), and the medians are
# compared: ratio = selsig / perftest. Defaults: perftest's (-Q 100 -t 128 -n 5000 -q 1),
# sizes 64 4096 65536, 3 repeats. With -c selsig runs as two processes, as ib_write_bw does:
# `selsig serve` and `selsig bench --connect` (by default one process, a peer QP on the
# device; -c takes one queue pair only). With -o each runs once per size and prints its
# command line, the date and its whole output (ib_write_bw's client's), for docs/bench.md;
# -G adds --report_gbits to both.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

cq_mod=100 depth=128 iters=5000 reps=3 connect=0 qps=1 show=0 gbits=
while getopts "coGq:Q:t:n:r:h" opt; do
  case $opt in
    c) connect=1 ;;
    o) show=1 ;;
    G) gbits=--report_gbits ;;
    q) qps=$OPTARG ;;
    Q) cq_mod=$OPTARG ;;
    t) depth=$OPTARG ;;
    n) iters=$OPTARG ;;
    r) reps=$OPTARG ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
sizes=${*:-64 4096 65536}
for v in "$cq_mod" "$depth" "$iters" "$reps" "$qps" $sizes; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "perftest-compare: not a positive number: $v" >&2; exit 2; }
done
[ -z "$gbits" ] || [ "$show" = 1 ] || { echo "perftest-compare: -G goes with -o (the medians are of MB/sec)" >&2; exit 2; }
[ "$connect" = 0 ] || [ "$qps" = 1 ] || { echo "perftest-compare: -c takes one queue pair (selsig bench refuses --qp with --connect)" >&2; exit 2; }

scripts/rxe-vm/build.sh >&2
# The binary cargo built, wherever the target directory is (CARGO_TARGET_DIR, a config).
bin=$(cargo build -q --release -p selsig-cli --message-format=json-render-diagnostics \
  | sed -n 's/.*"executable":"\([^"]*\/selsig\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "perftest-compare: could not build selsig" >&2; exit 1; }
# The VM sees this machine's files read-only, and an empty /tmp: a target directory outside
# the clone (CARGO_TARGET_DIR=/tmp/...) is shared with it.
case "$bin" in "$PWD"/*) ;; *) export SELSIG_VM_RW="${SELSIG_VM_RW:+$SELSIG_VM_RW:}$(dirname "$bin")" ;; esac

# Inside the VM: GID index 1 is rxe0's stable RoCE v2 address, 10.77.0.1 (scripts/rxe-vm).
read -r -d '' inside <<'EOF' || true
set -u
# (-F: perftest's leave to run when the CPU's frequency may vary, which its cycle counter
# needs; selsig reads no cycle counter and has no such flag.)
flags="-d rxe0 -x 1 --cq-mod $CQ_MOD -t $DEPTH -n $ITERS -q $QPS${GBITS:+ $GBITS}"
common="$flags -F"
port=18600
# The table's #iterations: ITERS on each queue pair.
rows=$((ITERS * QPS))
if [ "$SHOW" = 1 ]; then
  # Each once per size, verbatim: ib_write_bw's server in the background, its client, then
  # selsig bench with the same flags (and the binary's path shortened to `selsig`).
  for size in $SIZES; do
    port=$((port + 1))
    ib_write_bw $common -s "$size" -p $port >/tmp/server.log 2>&1 &
    server=$!
    sleep 2
    echo "\$ ib_write_bw $common -s $size -p $port 10.77.0.1    # $(date -u '+%Y-%m-%d %H:%M UTC')"
    ib_write_bw $common -s "$size" -p $port 10.77.0.1 2>&1 || { cat /tmp/server.log; kill $server 2>/dev/null; exit 1; }
    wait $server || true
    echo
    echo "\$ selsig bench --provider verbs $flags -s $size    # $(date -u '+%Y-%m-%d %H:%M UTC')"
    # (Its standard error, a progress bar on the VM's terminal, only if it fails.)
    "$BIN" bench --provider verbs $flags -s "$size" 2>/tmp/selsig.err || { cat /tmp/selsig.err; exit 1; }
    echo
  done
  exit 0
fi
# (A run that printed no figure, or 0.00, does not count.)
median() { awk '$1 > 0' | sort -g | awk '{v[NR]=$1} END {if (NR) print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
perftest() {   # size -> MB/s
  port=$((port + 1))
  ib_write_bw $common -s "$1" -p $port >/tmp/server.log 2>&1 &
  local server=$!
  sleep 2
  local out
  out=$(ib_write_bw $common -s "$1" -p $port 10.77.0.1 2>&1) || { echo "$out" >&2; kill $server 2>/dev/null; return 1; }
  wait $server || true
  echo "$out" | awk -v s="$1" -v n="$rows" '$1 == s && $2 == n {print $4}'
}
selsig() {
  local out target=() server=
  if [ "$CONNECT" = 1 ]; then
    port=$((port + 1))
    # Both ends know the secret: a fresh one for each server.
    SELSIG_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    export SELSIG_SECRET
    "$BIN" serve --provider verbs -d rxe0 -x 1 -p $port --once 2>/tmp/serve.log &
    server=$!
    sleep 1
    target=(--connect "10.77.0.1:$port")
  fi
  out=$("$BIN" bench --provider verbs -d rxe0 -x 1 --cq-mod "$CQ_MOD" -t "$DEPTH" -n "$ITERS" -q "$QPS" -s "$1" "${target[@]}" 2>/tmp/selsig.err) \
    || { cat /tmp/selsig.err /tmp/serve.log >&2 2>/dev/null; [ -n "$server" ] && kill $server 2>/dev/null; return 1; }
  [ -z "$server" ] || wait $server || true
  echo "$out" | awk -v s="$1" -v n="$rows" '$1 == s && $2 == n {print $4}'
}
printf '%-8s %-8s %-8s %-8s %-4s %18s %18s %8s\n' size cq-mod depth iters qps "perftest MB/s" "selsig MB/s" ratio
for size in $SIZES; do
  : > /tmp/p; : > /tmp/s
  for r in $(seq "$REPS"); do
    if [ $((r % 2)) = 1 ]; then perftest "$size" >> /tmp/p; selsig "$size" >> /tmp/s
    else selsig "$size" >> /tmp/s; perftest "$size" >> /tmp/p; fi
  done
  p=$(median < /tmp/p); s=$(median < /tmp/s)
  [ -n "$p" ] && [ -n "$s" ] || { echo "perftest-compare: no figure for $size B (perftest: $p, selsig: $s)" >&2; exit 1; }
  echo "  $size B: perftest $(tr '\n' ' ' < /tmp/p)| selsig $(tr '\n' ' ' < /tmp/s)" >&2
  printf '%-8s %-8s %-8s %-8s %-4s %18.2f %18.2f %8.2f\n' "$size" "$CQ_MOD" "$DEPTH" "$ITERS" "$QPS" "$p" "$s" "$(awk -v a="$s" -v b="$p" 'BEGIN {print a / b}')"
done
EOF

CQ_MOD=$cq_mod DEPTH=$depth ITERS=$iters REPS=$reps SIZES=$sizes BIN=$bin CONNECT=$connect QPS=$qps SHOW=$show GBITS=$gbits \
  SELSIG_VM_TIMEOUT=${SELSIG_VM_TIMEOUT:-1800} scripts/rxe-vm/run.sh "$inside"
