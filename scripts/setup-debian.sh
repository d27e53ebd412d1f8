#!/usr/bin/env bash
# Installs what building and testing selsig needs on Debian 12 (bookworm), idempotently:
# a C toolchain and pkg-config (crates that build C), libibverbs-dev (the header the verbs
# provider's layout test compares its FFI declarations with; the provider itself loads
# libibverbs at run time and builds without it), and Rust through rustup when no cargo is
# on PATH. Safe to run again: it only installs what is missing.
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

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  echo "setup: installing Rust (rustup, stable)" >&2
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy >&2
fi
