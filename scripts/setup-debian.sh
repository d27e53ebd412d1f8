#!/usr/bin/env bash
# Installs what building and testing selsig needs on Debian 12 (bookworm), idempotently:
# a C toolchain and pkg-config (crates that build C), libibverbs-dev (the header the verbs
# provider's layout test compares its FFI declarations with; the provider itself loads
# libibverbs at run time and builds without it), and Rust through rustup when there is no
# cargo, or only one older than the workspace's rust-version (Debian's own). Safe to run
# again: it only installs what is missing. Needs root, or a user who may sudo.
set -euo pipefail

PKGS=(build-essential pkg-config curl ca-certificates libibverbs-dev)

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
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# The Rust the README's commands use: rustup's in ~/.cargo/bin first, as their PATH puts it.
# Debian 12's own cargo (1.63) is too old for the workspace (edition 2024).
need=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$(dirname "$0")/../Cargo.toml")
cargo_version() {
  PATH="$HOME/.cargo/bin:$PATH" cargo --version 2>/dev/null | awk '{print $2}' | cut -d- -f1
}
new_enough() { [ -n "$1" ] && [ "$(printf '%s\n%s\n' "$need" "$1" | sort -V | head -n 1)" = "$need" ]; }
have=$(cargo_version)
if ! new_enough "$have"; then
  if [ -x "$HOME/.cargo/bin/rustup" ]; then
    echo "setup: Rust ${have:-(none)} is older than $need: updating the stable toolchain (rustup)" >&2
    "$HOME/.cargo/bin/rustup" toolchain install stable --profile minimal -c rustfmt,clippy >&2
    "$HOME/.cargo/bin/rustup" default stable >&2
  else
    echo "setup: installing Rust (rustup, stable): found ${have:-no cargo}, the workspace needs $need or later" >&2
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy >&2
  fi
  have=$(cargo_version)
  new_enough "$have" || { echo "setup: Rust ${have:-(none)} is still older than $need" >&2; exit 1; }
fi
