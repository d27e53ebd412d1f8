#!/usr/bin/env bash
# Runs selsig's tests that need an RDMA device against real rdma-core and the kernel's
# Soft-RoCE (rxe0), inside the project's qemu VM (scripts/rxe-vm): this machine's kernel
# may have no RDMA at all. The test binaries are built here (the VM runs them; compiling
# under TCG would be slow), then run inside with --ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

scripts/rxe-vm/build.sh

bins=$(cargo test -q --no-run -p selsig-verbs -p selsig-cli --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | grep -E '/(rxe|verbs)-[0-9a-f]+$' || true)
[ "$(echo "$bins" | wc -w)" = 2 ] || { echo "verbs-tests: could not build the test binaries: $bins" >&2; exit 1; }
sel=$(cargo build -q -p selsig-cli --message-format=json \
  | sed -n 's/.*"executable":"\([^"]*\/selsig\)".*/\1/p')
[ -x "$sel" ] || { echo "verbs-tests: could not build selsig" >&2; exit 1; }

# GID index 1 is rxe0's stable IPv4-mapped RoCE v2 address (10.77.0.1) in the VM.
cmd="set -e; export SELSIG_GID_INDEX=1 SELSIG_SERVE_ADDR=10.77.0.1 RUST_BACKTRACE=1"
for b in $bins; do
  cmd="$cmd; echo \"== $(basename "$b")\"; $b --ignored --test-threads=1"
done
# Last, as it takes rxe0's link down: a port that is not ACTIVE is the host's state (exit
# code 1), named, not a bad option.
cmd="$cmd; echo '== a port whose link is down'; ip link set dummy0 down; rc=0
out=\$($sel demo --provider verbs -d rxe0 2>&1) || rc=\$?; ip link set dummy0 up
echo \"\$out\"; echo \"exit code \$rc\"; [ \$rc = 1 ]
echo \"\$out\" | grep -q 'port 1 of rxe0 is DOWN, not ACTIVE (is its link up?)'; echo ok"
SELSIG_VM_TIMEOUT=${SELSIG_VM_TIMEOUT:-900} scripts/rxe-vm/run.sh "$cmd"
