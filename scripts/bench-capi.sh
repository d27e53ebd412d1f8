#!/usr/bin/env bash
# What crossing the C boundary costs per work request: libselsig's batch calls from C
# (crates/selsig-capi/benches/post_retire.c) beside the Rust tracker doing the same stream
# (criterion, crates/selsig/benches/tracker.rs: the same batch calls, post_batch_and_retire,
# and one call per work request, post_and_retire; crates/selsig-verbs/benches/ibv_wc.rs:
# the batch calls fed ibv_wc entries, as a Rust program on libibverbs gets them), in one run on this
# machine. Both with the release profile (LTO). Figures: docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build -q --release -p selsig-capi
out=target/release/c-post-retire
cc -std=c11 -O2 -Wall -Wextra -Werror -I crates/selsig-capi/include \
  crates/selsig-capi/benches/post_retire.c target/release/libselsig_capi.a \
  -lpthread -ldl -lm -o "$out"
echo "== the C API (median of 15 runs)"
"$out"
echo "== the Rust tracker (criterion)"
cargo bench -q -p selsig --bench tracker -- 'post_and_retire|post_batch_and_retire|post_batch_and_complete' 2>&1 \
  | grep -E 'time:|and_retire|and_complete' || true
echo "== the Rust tracker fed ibv_wc entries, as from ibv_poll_cq (criterion)"
cargo bench -q -p selsig-verbs --bench ibv_wc 2>&1 | grep -E 'time:|ibv_wc' || true
