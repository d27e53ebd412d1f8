#!/usr/bin/env bash
# Two hosts: `selsig serve` in one VM (host A) and its clients in another (host B), each
# with its own virtio NIC and its own Soft-RoCE device rxe0, joined by a wire through this
# machine's loopback only (scripts/rxe-vm, SELSIG_VM_WIRE), on a private subnet. From B,
# against A's address: the seed demo, the bad-rkey demo, a bench sweep, and a scenario with
# a remote side where `selsig run` takes --connect; each client's result is checked, and so
# is the server's check of its memory after every session. Where the clients take --cm,
# all of it runs once per connection manager (tcp, rdma).
#
# Knobs (environment): TWO_HOSTS_TIMEOUT (s, default 480) bounds each VM, and each wait and
# client inside; TWO_HOSTS_WIRE_PORT (default from this script's process id) is the first of
# the two UDP ports on 127.0.0.1 the wire uses.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

scripts/rxe-vm/build.sh

# The `selsig` binary, from the same build as scripts/verbs-tests.sh's (the same command:
# after that script, nothing is compiled again; a `cargo build -p selsig-cli` would compile
# a second set of dependencies, with other features). A debug build: the bench sweep below
# is sized for it.
json=$(cargo test -q --no-run -p selsig-verbs -p selsig-cli -p selsig-capi -p selsig-tokio --message-format=json-render-diagnostics) \
  || { echo "two-hosts: could not build selsig" >&2; exit 1; }
sel=$(sed -n 's/.*"executable":"\([^"]*\/selsig\)".*/\1/p' <<< "$json" | tail -n 1)
[ -x "$sel" ] || { echo "two-hosts: cargo built no selsig binary" >&2; exit 1; }

# takes SUBCOMMAND OPTION: `selsig SUBCOMMAND --help` lists OPTION among its options (not
# only in the text of another's). (Not `selsig ... | grep -q`: grep may end first, and the
# pipeline then fails with SIGPIPE.)
takes() { grep -qE -- "^ +(-[a-zA-Z], )?$2( |=|\$)" <<< "$("$sel" "$1" --help)"; }
# The connection managers: today's exchange over TCP, or each that --cm names.
# (`serve` answers both: the client's hello says which.)
if takes demo --cm; then modes="tcp rdma"; else modes="exchange"; fi
if takes run --connect; then remote_run=1; else remote_run=""; fi

TIMEOUT=${TWO_HOSTS_TIMEOUT:-480}
wire=${TWO_HOSTS_WIRE_PORT:-$((20000 + ($$ % 10000) * 2))}

# The directory both VMs share read-write with this machine: the secret, each side's log,
# and the files that say how far each side got. (The VMs see this machine's files
# read-only, and an empty /tmp: a target directory under /tmp is shared with them too.)
work=$(mktemp -d "$(dirname "$sel")/two-hosts.XXXXXX")
trap 'rm -rf "$work"' EXIT
rw=$work
case "$sel" in "$PWD"/*) ;; *) rw="$(dirname "$sel")" ;; esac
(umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$work/secret")

# What both sides run, in their VM: the GID index of rxe0's IPv4-mapped RoCE v2 address.
cat > "$work/common.sh" <<'EOF'
set -euo pipefail
# gid_of A.B.C.D: the index of rxe0's RoCE v2 GID ::ffff:A.B.C.D (it can take a moment to
# appear once the address is up).
gid_of() {
  local want port=/sys/class/infiniband/rxe0/ports/1 g i
  want=$(IFS=. && printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' $1)
  for _ in $(seq 50); do
    for g in "$port"/gids/*; do
      i=${g##*/}
      if [ "$(cat "$g")" = "$want" ] && [ "$(cat "$port/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ]; then
        echo "$i"; return 0
      fi
    done
    sleep 0.2
  done
  echo "two-hosts: rxe0 has no RoCE v2 GID for $1" >&2; return 1
}
# wait_for FILE: until FILE exists; fails when the other side ended first, or after
# TWO_HOSTS_TIMEOUT seconds.
wait_for() {
  local end=$((SECONDS + TWO_HOSTS_TIMEOUT))
  until [ -e "$1" ]; do
    [ ! -e "$WORK/$OTHER.ended" ] || { echo "two-hosts: host $OTHER ended before ${1##*/}" >&2; return 1; }
    [ $SECONDS -lt $end ] || { echo "two-hosts: no ${1##*/} after ${TWO_HOSTS_TIMEOUT}s" >&2; return 1; }
    sleep 0.3
  done
}
cm_name() { if [ "$1" = exchange ]; then echo "the TCP exchange (this selsig has no --cm)"; else echo "--cm $1"; fi; }
EOF

# Host A: one server per connection manager, until the clients say they are done with it;
# then its log shows that every session's memory check passed, as many as the clients ran.
cat > "$work/A.sh" <<'EOF'
source "$WORK/common.sh"
trap 'touch "$WORK/A.ended"' EXIT
gid=$(gid_of "$ADDR_A")
echo "host A: $ADDR_A, rxe0 GID index $gid (::ffff:$ADDR_A, RoCE v2): selsig serve"
i=0
for mode in $MODES; do
  port=$((18515 + i)); i=$((i + 1))
  # (On the VM's own tmpfs: a line written through the share takes a while under TCG, and
  # the server writes each session's line before it takes the next client.)
  log=/tmp/serve-$mode.log
  "$SEL" serve --provider verbs -d rxe0 -x "$gid" --bind "$ADDR_A" --port "$port" \
    --secret-file "$WORK/secret" > "$log" 2>&1 &
  pid=$!
  end=$((SECONDS + TWO_HOSTS_TIMEOUT))
  until grep -q 'listening' "$log"; do
    if ! kill -0 $pid 2>/dev/null || [ $SECONDS -ge $end ]; then
      echo "two-hosts: selsig serve ($(cm_name "$mode")) did not start:"; cat "$log"; exit 1
    fi
    sleep 0.2
  done
  echo "$port" > "$WORK/listening-$mode"
  ok=1; wait_for "$WORK/done-$mode" || ok=
  if ! kill -0 $pid 2>/dev/null; then echo "two-hosts: selsig serve ($(cm_name "$mode")) ended by itself"; ok=; fi
  kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true
  echo "== host A, $(cm_name "$mode"): selsig serve's log"
  cat "$log"
  [ -n "$ok" ] || exit 1
  # Every session the server saw is one of B's, checked and found right (or, a scenario's,
  # its region's digest sent for B to compare); as many as B's clients made.
  from="^selsig serve: client ${ADDR_B//./\\.}:[0-9]*: "
  sessions=$(grep -c 'selsig serve: client ' "$log" || true)
  checked=$(grep -c "$from[0-9]* slots checked (each holds the last WRITE to it), memory as the outcomes say$" "$log" || true)
  digests=$(grep -c "${from}the digest of its [0-9]*-byte region sent ([0-9a-f]\{16\})$" "$log" || true)
  read -r least most < "$WORK/done-$mode"
  if [ $((checked + digests)) != "$sessions" ] || [ "$sessions" -lt "$least" ] || [ "$sessions" -gt "$most" ]; then
    echo "two-hosts: host A, $(cm_name "$mode"): of $sessions sessions from $ADDR_B, $checked checked and found right and $digests digests sent, expected $(if [ "$least" = "$most" ]; then echo "$least"; else echo "$least to $most"; fi) sessions, all right"
    exit 1
  fi
  echo "host A, $(cm_name "$mode"): $sessions sessions from $ADDR_B: $checked with memory as their outcomes say, $digests scenarios' digests sent"
done
EOF

# Host B: the clients, once A listens.
cat > "$work/B.sh" <<'EOF'
source "$WORK/common.sh"
trap 'touch "$WORK/B.ended"' EXIT
gid=$(gid_of "$ADDR_B")
echo "host B: $ADDR_B, rxe0 GID index $gid (::ffff:$ADDR_B, RoCE v2): the clients"
export SELSIG_SECRET_FILE=$WORK/secret
# client NAME SESSIONS ARGS...: runs selsig ARGS on rxe0 against host A (SESSIONS sessions
# of the server), shows what it printed; its standard output is in $out.
# (A client that opens sessions back to back, as a bench sweep does, meets the server still
# taking its previous session down: the server holds it until then, up to 2 s.)
least=0 most=0
client() {
  local name=$1 n=$2 rc=0; shift 2
  local args=("$@" --provider verbs -d rxe0 -x "$gid" --connect "$target")
  [ "$mode" = exchange ] || args+=(--cm "$mode")
  echo "== host B, $(cm_name "$mode"): $name: selsig ${args[*]}"
  out=$(timeout "$TWO_HOSTS_TIMEOUT" "$SEL" "${args[@]}" 2> "$WORK/B.err") || rc=$?
  err=$(cat "$WORK/B.err")
  [ -z "$out" ] || echo "$out"
  [ -z "$err" ] || echo "$err"
  [ $rc = 0 ] || { echo "two-hosts: $name: exit code $rc"; return 1; }
  least=$((least + n)) most=$((most + n))
}
# has TEXT: the last client's standard output has the line TEXT.
has() { grep -qxF -- "$1" <<< "$out" || { echo "two-hosts: $name: no line '$1'"; return 1; }; }
for mode in $MODES; do
  wait_for "$WORK/listening-$mode"
  target=$ADDR_A:$(cat "$WORK/listening-$mode")
  least=0 most=0

  name=seed; client "$name" 1 demo
  has "The WRITEs go to the memory of selsig serve on rxe0 at $target."
  has "  WR1(U) → WR2(U) → WR3(U) → WR4(S) → WR5(U) → WR6(U) → WR7(U) → WR8(S)"
  [ "$(grep -c '^  CQE' <<< "$out")" = 2 ] || { echo "two-hosts: seed: not 2 CQEs"; exit 1; }
  grep -q '^  CQE4: WR1–WR4 confirmed .*success, rdma_write)$' <<< "$out" || { echo "two-hosts: seed: no CQE4"; exit 1; }
  grep -q '^  CQE8: WR5–WR8 confirmed .*success, rdma_write)$' <<< "$out" || { echo "two-hosts: seed: no CQE8"; exit 1; }
  has "Remote buffer: all 8 writes verified (512 bytes)."

  name="bad rkey"; client "$name" 1 demo --fail-at 3
  has "WR3 is posted with a bad remote key."
  grep -q '^  CQE3: WR1–WR2 completed, WR3 failed .*rem_access_err' <<< "$out" || { echo "two-hosts: bad rkey: no CQE3 rem_access_err"; exit 1; }
  [ "$(grep -c '^  CQE[4-8]: WR[4-8] flushed .*wr_flush_err)$' <<< "$out")" = 5 ] || { echo "two-hosts: bad rkey: not 5 flushes"; exit 1; }
  has "Remote buffer: verified: the 2 completed writes landed (128 bytes), the 6 others did not."

  # A sweep: a warm-up and 4 points, a session each, every slot checked by the server.
  name="bench sweep"; client "$name" 5 bench -n 1000 -s 64,4K -e 1,16
  grep -q -- "-> selsig serve at $target" <<< "$out" || { echo "two-hosts: bench: no '-> selsig serve at $target'"; exit 1; }
  # One row a point: every:1 makes 1000 completions per 1000 WRITEs, every:16 63.
  rows=$(awk '$1 ~ /^(64B|4KiB)$/ && ($2 == "every:1" && $5 == "1000.0" || $2 == "every:16" && $5 == "63.0")' <<< "$out" | wc -l)
  [ "$rows" = 4 ] || { echo "two-hosts: bench: $rows rows of 64B and 4KiB points with 1000 or 63 CQEs per 1000 WRITEs, expected 4"; exit 1; }

  # A scenario with a remote side, where `selsig run` takes --connect.
  if [ -n "$REMOTE_RUN" ]; then
    # Its trace: the same as the software NIC's rxe personality gives in one process, the
    # region's digest read on A. The seed, and the bad rkey.
    for story in seed error-mid; do
      name="scenario $story"; client "$name" 1 run "scenarios/$story.toml"
      [ "$out" = "$("$SEL" run "scenarios/$story.toml" --personality rxe)" ] \
        || { echo "two-hosts: $name: the trace differs from the software NIC's rxe personality's"; exit 1; }
      grep -qF "are selsig serve's, rxe0 at $target" "$WORK/B.err" \
        || { echo "two-hosts: $name: no line naming the server at $target"; exit 1; }
    done
  else
    echo "== host B, $(cm_name "$mode"): scenario: not run, this selsig's run has no --connect"
  fi
  echo "$least $most" > "$WORK/done-$mode"
done
echo "host B: every client passed"
EOF

echo "two-hosts: host A 10.79.0.1 and host B 10.79.0.2, on a wire through 127.0.0.1 UDP ports $wire and $((wire + 1)); connection managers: $modes"
export SEL="$sel" WORK="$work" MODES="$modes" REMOTE_RUN="$remote_run" ADDR_A=10.79.0.1 ADDR_B=10.79.0.2 TWO_HOSTS_TIMEOUT="$TIMEOUT"
# Both VMs run the whole time, on a vCPU each (two cores: faster than two each, measured).
vm() {
  local me=$1 other=$2 port=$3 peer=$4 addr=$5 rc=0
  OTHER=$other SELSIG_VM_SMP=1 SELSIG_VM_TIMEOUT=$((TIMEOUT + 60)) SELSIG_VM_RW="$rw" \
    SELSIG_VM_WIRE="$port:$peer" SELSIG_VM_ADDR="$addr/24" \
    scripts/rxe-vm/run.sh "bash $(printf %q "$work/$me.sh")" > "$work/$me.out" 2>&1 &
  echo $! > "$work/$me.pid"
  wait $! || rc=$?
  echo "$rc" > "$work/$me.rc"
  # A VM that ended early (it failed to boot, say) stops the other's waits.
  touch "$work/$me.ended"
}
# Stopped (Ctrl-C, a CI job cancelled): run.sh stops its VM when told to.
stop() {
  for p in "$work"/A.pid "$work"/B.pid; do [ ! -e "$p" ] || kill -TERM "$(cat "$p")" 2>/dev/null || true; done
  wait; exit "$1"
}
trap 'stop 130' INT
trap 'stop 143' TERM
start=$SECONDS
vm A B "$wire" $((wire + 1)) 10.79.0.1 &
a=$!
vm B A $((wire + 1)) "$wire" 10.79.0.2 &
b=$!
wait $a $b
trap - INT TERM
echo "----- host A (10.79.0.1): exit code $(cat "$work/A.rc")"
cat "$work/A.out"
echo "----- host B (10.79.0.2): exit code $(cat "$work/B.rc")"
cat "$work/B.out"
echo "-----"
if [ "$(cat "$work/A.rc")" != 0 ] || [ "$(cat "$work/B.rc")" != 0 ]; then
  echo "two-hosts: FAILED ($((SECONDS - start))s)" >&2; exit 1
fi
echo "two-hosts: ok: selsig serve on 10.79.0.1, its clients on 10.79.0.2 ($modes), $((SECONDS - start))s"
