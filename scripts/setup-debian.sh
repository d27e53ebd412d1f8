#!/usr/bin/env bash
# Installs what building and testing selsig needs on Debian 12 (bookworm), idempotently:
# a C toolchain and pkg-config (crates that build C), libibverbs-dev (the header the verbs
# provider's layout test compares its FFI declarations with; the provider itself loads
# libibverbs at run time and builds without it), procps (`kill`, which a CLI test runs), and
# the Rust toolchain rust-toolchain.toml names, through rustup (installed if missing). Safe
# to run again: it only installs what is missing. Needs root, or a user who may sudo.
# cmake, clang and libclang-dev build the sideway example's bindings (examples/sideway, a
# workspace of its own that CI builds and runs on Soft-RoCE).
set -euo pipefail

PKGS=(build-essential pkg-config curl ca-certificates libibverbs-dev procps cmake clang libclang-dev)

SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# Rust: the toolchain rust-toolchain.toml names, with rustfmt and clippy, through rustup in
# ~/.cargo/bin (first in the PATH of the README's commands). Debian 12's own cargo (1.63) is
# too old for the workspace (edition 2024) and knows nothing of rust-toolchain.toml.
root="$(cd "$(dirname "$0")/.." && pwd)"
channel=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$root/rust-toolchain.toml")
[ -n "$channel" ] || { echo "setup: no channel in $root/rust-toolchain.toml" >&2; exit 1; }
# (rustup's home for its binaries: CARGO_HOME where set, as in the official Rust images.)
bin="${CARGO_HOME:-$HOME/.cargo}/bin"
rustup=$(PATH="$bin:$PATH" command -v rustup || echo "$bin/rustup")
if [ ! -x "$rustup" ]; then
  echo "setup: installing Rust $channel (rustup)" >&2
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
    | sh -s -- -y --profile minimal --default-toolchain "$channel" -c rustfmt,clippy >&2
fi
# Checked locally first: `rustup toolchain install` asks the network even when nothing is
# missing.
if ! "$rustup" run "$channel" rustfmt --version >/dev/null 2>&1 \
  || ! "$rustup" run "$channel" cargo-clippy --version >/dev/null 2>&1; then
  echo "setup: installing Rust $channel with rustfmt and clippy (rustup)" >&2
  "$rustup" toolchain install "$channel" --profile minimal -c rustfmt,clippy --no-self-update >&2
fi
have=$(cd "$root" && PATH="$bin:$HOME/.cargo/bin:$PATH" cargo --version 2>/dev/null || true)
case "$have" in
  "cargo $channel "*) ;;
  *) echo "setup: cargo in $root is '${have:-missing}', not Rust $channel" >&2; exit 1;;
esac
