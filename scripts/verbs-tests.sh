#!/usr/bin/env bash
# Runs selsig's tests that need an RDMA device against real rdma-core and the kernel's
# Soft-RoCE (rxe0), inside the project's qemu VM (scripts/rxe-vm): this machine's kernel
# may have no RDMA at all. The test binaries are built here (the VM runs them; compiling
# under TCG would be slow), then run inside with --ignored; so are libselsig's C example
# (examples/c/seed.c), built here with the system compiler, the sideway example
# (examples/sideway) and the async driver's tests and example (crates/selsig-tokio).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

scripts/rxe-vm/build.sh

# (json-render-diagnostics: cargo renders compiler errors on stderr, not inside the JSON on
# stdout; its exit code is checked apart from the pipeline's.) The same build gives the
# `selsig` binary the CLI's tests run (a separate `cargo build -p selsig-cli` would compile
# a second set of dependencies, with other features, for nothing).
json=$(cargo test -q --no-run -p selsig-verbs -p selsig-cli -p selsig-capi -p selsig-tokio --message-format=json-render-diagnostics) \
  || { echo "verbs-tests: could not build the test binaries" >&2; exit 1; }
mapfile -t bins < <(sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' <<< "$json" | grep -E '/(rxe|verbs|async_rxe)-[0-9a-f]+$' || true)
[ "${#bins[@]}" = 3 ] || { echo "verbs-tests: expected the rxe, verbs and async_rxe test binaries, found: ${bins[*]}" >&2; exit 1; }
sel=$(sed -n 's/.*"executable":"\([^"]*\/selsig\)".*/\1/p' <<< "$json" | tail -n 1)
[ -x "$sel" ] || { echo "verbs-tests: cargo built no selsig binary" >&2; exit 1; }
# The VM sees this machine's files read-only, and an empty /tmp: a target directory outside
# the clone (CARGO_TARGET_DIR=/tmp/...) is shared with it.
case "$sel" in "$PWD"/*) ;; *) export SELSIG_VM_RW="${SELSIG_VM_RW:+$SELSIG_VM_RW:}$(dirname "$sel")" ;; esac

# libselsig's C example, plain libibverbs with the static library the same build made,
# compiled here and run in the VM: the seed, and a bad rkey on WR3.
cseed="$(dirname "$sel")/c-seed"
cargo build -q -p selsig-capi --lib  # (`cargo test` builds its rlib only)
# The bare tracker over queue pairs of selsig-verbs, posted and polled by the program.
cargo build -q -p selsig-verbs --example tracker_seed
tseed="$(dirname "$sel")/examples/tracker_seed"
# The async driver's example: 8 queue pairs streaming WRITEs over one CQ, asleep on its
# completion channel.
cargo build -q -p selsig-tokio --example async_stream
astream="$(dirname "$sel")/examples/async_stream"
cc -std=c11 -O2 -Wall -Wextra -Werror -I crates/selsig-capi/include examples/c/seed.c \
  "$(dirname "$sel")/libselsig_capi.a" -libverbs -lpthread -ldl -lm -o "$cseed"

# The same story on a queue pair made with sideway (examples/sideway, its own workspace).
cargo build -q --release --locked --manifest-path examples/sideway/Cargo.toml --target-dir target/sideway
cargo clippy -q --release --locked --manifest-path examples/sideway/Cargo.toml --target-dir target/sideway -- -D warnings
swseed="$PWD/target/sideway/release/selsig-sideway-seed"

# GID index 1 is rxe0's stable IPv4-mapped RoCE v2 address (10.77.0.1) in the VM.
cmd="set -e; export SELSIG_GID_INDEX=1 SELSIG_SERVE_ADDR=10.77.0.1 RUST_BACKTRACE=1"
for b in "${bins[@]}"; do
  cmd="$cmd; echo $(printf '%q' "== $(basename "$b")"); $(printf '%q' "$b") --ignored --test-threads=1"
done
cmd="$cmd; echo '== examples/c/seed.c'; $(printf '%q' "$cseed") --device rxe0 --gid-index 1
$(printf '%q' "$cseed") --device rxe0 --gid-index 1 --fail-at 3
echo '== selsig-verbs/examples/tracker_seed.rs'; $(printf '%q' "$tseed") --device rxe0 --gid-index 1
$(printf '%q' "$tseed") --device rxe0 --gid-index 1 --fail-at 3
echo '== selsig-tokio/examples/async_stream.rs'; $(printf '%q' "$astream") --device rxe0 --gid-index 1 --writes 500
echo '== examples/sideway'; $(printf '%q' "$swseed") --device rxe0 --gid-index 1
$(printf '%q' "$swseed") --device rxe0 --gid-index 1 --fail-at 3"
# Generated scenarios on rxe0, each race-free one's trace the same as the software NIC's
# rxe personality's (docs/campaign.md); a failure's files are shown.
cmd="$cmd; echo '== selsig campaign on rxe0'; $(printf '%q' "$sel") campaign --provider verbs -d rxe0 -x 1 -q -n ${SELSIG_CAMPAIGN_RXE:-2000} --seed 1 --against soft:rxe --keep-failures /tmp/campaign || { cat /tmp/campaign/*.txt; exit 1; }"
# Last, as it takes rxe0's link down: a port that is not ACTIVE is the host's state (exit
# code 1), named, not a bad option.
cmd="$cmd; echo '== a port whose link is down'; ip link set dummy0 down; rc=0
out=\$($(printf '%q' "$sel") demo --provider verbs -d rxe0 2>&1) || rc=\$?; ip link set dummy0 up
echo \"\$out\"; echo \"exit code \$rc\"; [ \$rc = 1 ]
echo \"\$out\" | grep -q 'port 1 of rxe0 is DOWN, not ACTIVE (is its link up?)'; echo ok"
# An rxe device is known as one under any name: a scenario whose rxe expectations differ
# (no async event for the responder's access error) passes on one named roce9.
cmd="$cmd; echo '== an rxe device named roce9'; ip link add dummy1 type dummy
ip addr add 10.78.0.1/24 dev dummy1; ip link set dummy1 up; rdma link add roce9 type rxe netdev dummy1; rc=0
out=\$($(printf '%q' "$sel") run scenarios/error-mid.toml --provider verbs -d roce9 -q 2>&1) || rc=\$?
rdma link delete roce9; ip link delete dummy1; echo \"\$out\"; echo \"exit code \$rc\"; [ \$rc = 0 ]
echo \"\$out\" | grep -q 'the rxe expectations apply: rxe (Linux 6.1) moves the responder'; echo ok"
SELSIG_VM_TIMEOUT=${SELSIG_VM_TIMEOUT:-900} scripts/rxe-vm/run.sh "$cmd"
