#!/usr/bin/env bash
# build.sh - assemble selsig's tiny qemu VM that runs host programs against the kernel's
# Soft-RoCE driver (rdma_rxe), so selsig can be tested against a real kernel RDMA device (rxe0).
#
# Idempotent: re-running only redoes missing or outdated pieces (rm -rf the cache to start over).
# Needs Debian 12 apt sources, and root (or sudo) only for apt-get install of the host packages.
# The guest kernel package is downloaded and unpacked, never installed.
#
# Everything goes into the cache dir, outside the repository (~14 MB):
#   ${RXE_VM_CACHE:-$HOME/.cache/selsig-rxe-vm}/
#     vmlinuz              guest kernel (Debian's linux-image-amd64; SELSIG_VM_KERNEL_PKG pins it)
#     modules/             the .ko files the guest needs + their load order + kernel version and package
#     initramfs.cpio.gz    static busybox + those modules + ./init
#     runs/                per-run scratch dirs of run.sh
set -euo pipefail
# depmod and modprobe live in sbin, which a user's PATH on Debian lacks.
PATH="$PATH:/usr/sbin:/sbin"
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${RXE_VM_CACHE:-$HOME/.cache/selsig-rxe-vm}
mkdir -p "$CACHE"
cd "$CACHE"
# One build at a time per cache dir, and none while run.sh boots a VM from it (run.sh holds
# the lock shared).
exec 9> "$CACHE/.build.lock"
flock 9

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi

# 1. Host userspace: qemu; rdma-core userspace + perftest (run inside the VM from the host's root
#    over 9p); busybox-static (the initramfs); kmod (depmod/modprobe compute the module order).
PKGS="qemu-system-x86 rdma-core ibverbs-utils ibverbs-providers libibverbs-dev perftest
      iproute2 busybox-static kmod cpio gzip"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || missing="$missing $p"
done
# apt-get update when the package lists look empty (e.g. a fresh container or CI image), and
# once more when a download fails (lists older than the mirror name packages it dropped).
updated=""
update() { [ -n "$updated" ] && return 1; updated=1; $SUDO apt-get update >&2; }
if ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then update; fi
apt_install() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2; }
if [ -n "$missing" ]; then
  echo "build.sh: installing host packages:$missing" >&2
  # shellcheck disable=SC2086
  apt_install $missing || { update && apt_install $missing; }
fi

# 2. Guest kernel + the modules we need, from Debian's kernel package (apt-get download + dpkg -x).
#    virtio_pci/9pnet_virtio/9p: mount the host's / ; dummy: the netdev under rxe0;
#    rdma_rxe/ib_uverbs: Soft-RoCE + /dev/infiniband/uverbs0; rdma_ucm: librdmacm; ib_umad: umad0.
#    crc32_generic: rxe asks the crypto API for "crc32" (ICRC) when a device is created; that is
#    not a modules.dep dependency, and without it `rdma link add` fails with ENOENT.
#    virtio_net (with failover, net_failover): the NIC of a VM on a wire (run.sh's SELSIG_VM_WIRE).
MODS="virtio_pci 9pnet_virtio 9p dummy virtio_net crc32_generic rdma_rxe ib_uverbs rdma_ucm ib_umad"
# linux-image-amd64 is a metapackage; find the real image package it depends on.
img=${SELSIG_VM_KERNEL_PKG:-$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')}
[ -n "$img" ] || { echo "build.sh: cannot find the linux-image package behind linux-image-amd64" >&2; exit 1; }
if [ ! -e modules/order ] || [ "$HERE/build.sh" -nt modules/order ] \
  || [ "$(cat modules/package 2>/dev/null)" != "$img" ]; then
  rm -rf x modules; mkdir -p x modules
  echo "build.sh: downloading $img" >&2
  # (as root, apt warns that the download runs unsandboxed; harmless, filtered out)
  download() { (cd x && apt-get download "$img" 2>&1 | { grep -v 'unsandboxed' || true; } >&2); ls x/"$img"_*.deb >/dev/null 2>&1; }
  download || { update && download; } || { echo "build.sh: apt-get download $img failed" >&2; exit 1; }
  dpkg -x x/"$img"_*.deb x/root
  ver=$(ls x/root/lib/modules)
  depmod -b x/root "$ver"                      # the .deb ships no modules.dep
  for m in $MODS; do
    deps=$(modprobe -d x/root -S "$ver" --show-depends "$m") \
      || { echo "build.sh: $img has no module $m" >&2; exit 1; }
    printf '%s\n' "$deps" | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    cp "$ko" modules/ && basename "$ko" >> modules/order.tmp
  done
  cp "x/root/boot/vmlinuz-$ver" vmlinuz.tmp && mv vmlinuz.tmp vmlinuz
  echo "$ver" > modules/version
  echo "$img" > modules/package
  mv modules/order.tmp modules/order            # written last: marks this step complete
  rm -rf x                                      # the unpacked package is ~480 MB; keep only what we use
fi

# 3. initramfs: static busybox, the modules and /init (rebuilt whenever one of them changed).
if [ ! -e initramfs.cpio.gz ] || [ "$HERE/init" -nt initramfs.cpio.gz ] || [ modules/order -nt initramfs.cpio.gz ]; then
  rm -rf initramfs; mkdir -p initramfs/{bin,dev,proc,sys,newroot}
  cp /bin/busybox initramfs/bin/busybox
  for a in sh mount mkdir insmod cat echo poweroff sync chroot cut stty; do ln -s busybox initramfs/bin/$a; done
  cp -r modules initramfs/modules
  cp "$HERE/init" initramfs/init && chmod +x initramfs/init
  (cd initramfs && find . | cpio -o -H newc --quiet | gzip -1) > initramfs.cpio.gz.tmp
  mv initramfs.cpio.gz.tmp initramfs.cpio.gz
  rm -rf initramfs
fi

echo "build.sh: ok: $CACHE: kernel $(cat modules/version), $(wc -l < modules/order) modules, initramfs $(du -h initramfs.cpio.gz | cut -f1)" >&2
