#!/usr/bin/env bash
# A Stagecoach cluster on hosts made of network namespaces, for people (the tests use the same
# layout through tests/support/netns/hosts.h): a coordinator on host "coord" and N workers on
# hosts host-a, host-b, ..., each with its own address (10.78.0.2, .3, ...) and host name, all on
# one switch, every daemon reached at its advertised address (no loopback). Links can be slowed
# (tbf), given latency and loss (netem where the kernel has it, else the test support's packet
# relay, stagecoach-netns-relay), and cut. Needs root, iproute2, util-linux and ethtool
# (scripts/lib.sh installs them) and a build of the daemons (scripts/demo.sh or scripts/test.sh).
# No address is made in this machine's own namespace: reach the coordinator through the
# `stagectl` command below, which runs in the coordinator's host.
#
#   scripts/netns_cluster.sh up [--workers N] [--rate 1gbit] [--delay 1ms] [--loss 0.005]
#   scripts/netns_cluster.sh stagectl ARGS...     # e.g. stagectl submit configs/mlp.yaml
#   scripts/netns_cluster.sh exec HOST CMD...     # a command on a host (coord, host-a, ...)
#   scripts/netns_cluster.sh cut HOST | heal HOST # its link down / up again
#   scripts/netns_cluster.sh shape HOST --rate R  # its bandwidth (tbf), e.g. 100mbit
#   scripts/netns_cluster.sh status | down
# --delay and --loss apply to every link, each way: 1ms per link is 2 ms between two hosts.
# STAGECOACH_NETNS_NAME (default stagecoach-demo) names the namespaces, so several can coexist.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NAME="${STAGECOACH_NETNS_NAME:-stagecoach-demo}"
STATE="/run/$NAME"
SWITCH="$NAME-switch"

die() { echo "netns_cluster.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
for tool in ip tc unshare ethtool; do
  command -v "$tool" >/dev/null || die "'$tool' is missing: run scripts/test.sh or apt-get install iproute2 util-linux ethtool"
done

host_ns() { echo "$NAME-$1"; }
hosts() { cat "$STATE/hosts" 2>/dev/null || die "no cluster '$NAME' is up"; }
port_of() {
  local i=0 h
  for h in $(hosts); do
    [ "$h" = "$1" ] && { echo "p$i"; return; }
    i=$((i + 1))
  done
  die "no host '$1' (hosts: $(hosts | tr '\n' ' '))"
}
# Runs a command on a host under the host's name.
on_host() {
  local host="$1"; shift
  ip netns exec "$(host_ns "$host")" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}
# Starts a daemon on a host in the background; prints the address it listens on.
start_daemon() {
  local host="$1" log="$2"; shift 2
  on_host "$host" "$@" >"$log.out" 2>"$log" &
  echo $! >>"$STATE/pids"
  local line=""
  for _ in $(seq 100); do
    line="$(grep -m1 '^listening on ' "$log.out" 2>/dev/null || true)"
    [ -n "$line" ] && { echo "${line#listening on }"; return; }
    sleep 0.1
  done
  die "$* did not start in 10 s; see $log"
}

rate_limit() {  # NETNS DEV RATE
  local burst
  local bits="${3%bit}"
  burst=$(( $(numfmt --from=si "${bits^^}") / 8 / 100 ))  # 10 ms at the rate
  [ "$burst" -lt 32768 ] && burst=32768
  tc -n "$1" qdisc replace dev "$2" root tbf rate "$3" burst "$burst" latency 200ms
}

cmd_up() {
  local workers=2 rate="" delay="" loss=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --workers) workers="$2"; shift 2 ;;
      --rate) rate="$2"; shift 2 ;;
      --delay) delay="$2"; shift 2 ;;
      --loss) loss="$2"; shift 2 ;;
      *) die "unknown option '$1'" ;;
    esac
  done
  [ -d "$STATE" ] && die "'$NAME' is up already (scripts/netns_cluster.sh down first)"
  local bin="$BUILD_DIR"
  [ -x "$bin/coordinator/stagecoach-coordinator" ] || die "no build in $BUILD_DIR (scripts/demo.sh builds one)"
  mkdir -p "$STATE"
  local names=(coord) i
  for i in $(seq 0 $((workers - 1))); do names+=("host-$(printf "\\$(printf %o $((97 + i)))")"); done
  printf '%s\n' "${names[@]}" >"$STATE/hosts"
  ip netns add "$SWITCH" && ip -n "$SWITCH" link set lo up
  local netem=0 relay=0
  if [ -n "$delay$loss" ]; then
    if tc -n "$SWITCH" qdisc add dev lo root netem delay 1ms 2>/dev/null; then
      netem=1; tc -n "$SWITCH" qdisc del dev lo root
    else
      relay=1
    fi
  fi
  [ "$relay" -eq 0 ] && ip -n "$SWITCH" link add br0 type bridge && ip -n "$SWITCH" link set br0 up
  local relay_ports=()
  for i in "${!names[@]}"; do
    local ns; ns="$(host_ns "${names[$i]}")"
    ip netns add "$ns" && ip -n "$ns" link set lo up
    ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$SWITCH"
    ip -n "$ns" addr add "10.78.0.$((i + 2))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$SWITCH" link set "p$i" up
    if [ "$relay" -eq 1 ]; then
      ip netns exec "$ns" ethtool -K eth0 tx off sg off tso off gso off gro off >/dev/null
      ip netns exec "$SWITCH" ethtool -K "p$i" tx off sg off tso off gso off gro off >/dev/null
      ip -n "$SWITCH" link set "p$i" promisc on
      relay_ports+=("p$i=${delay:-0s},${loss:-0}")
    else
      ip -n "$SWITCH" link set "p$i" master br0
    fi
    for end in "$ns eth0" "$SWITCH p$i"; do
      set -- $end
      if [ "$netem" -eq 1 ]; then
        tc -n "$1" qdisc replace dev "$2" root netem delay "${delay:-0ms}" \
          loss "$(awk "BEGIN{print ${loss:-0} * 100}")%" ${rate:+rate "$rate"}
      elif [ -n "$rate" ]; then
        rate_limit "$1" "$2" "$rate"
      fi
    done
  done
  if [ "$relay" -eq 1 ]; then
    local relay_bin="$BUILD_DIR/tests/stagecoach-netns-relay"
    [ -x "$relay_bin" ] || die "no netem here and no $relay_bin (cmake --build $BUILD_DIR --target stagecoach-netns-relay)"
    "$relay_bin" --netns "$SWITCH" "${relay_ports[@]}" >"$STATE/relay.log" 2>&1 &
    echo $! >"$STATE/relay.pid"
  fi
  local coordinator
  coordinator="$(start_daemon coord "$STATE/coordinator.log" \
    "$bin/coordinator/stagecoach-coordinator" --listen 10.78.0.2:0)"
  echo "$coordinator" >"$STATE/coordinator"
  for i in $(seq 1 "$workers"); do
    local addr
    addr="$(start_daemon "${names[$i]}" "$STATE/worker-$i.log" "$bin/worker/stagecoach-worker" \
      --coordinator "$coordinator" --listen "10.78.0.$((i + 2)):0" --name "${names[$i]}")"
    echo "worker on ${names[$i]} at $addr"
  done
  echo "coordinator on coord at $coordinator; latency and loss by:" \
    "$([ "$relay" -eq 1 ] && echo relay || { [ "$netem" -eq 1 ] && echo netem || echo none; })"
  echo "logs in $STATE; try: scripts/netns_cluster.sh stagectl workers"
}

cmd_down() {
  [ -f "$STATE/pids" ] && xargs -r kill <"$STATE/pids" 2>/dev/null || true
  [ -f "$STATE/relay.pid" ] && kill "$(cat "$STATE/relay.pid")" 2>/dev/null || true
  sleep 1
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep "^$NAME-" || true); do
    ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
  rm -rf "$STATE"
}

cmd_status() {
  local i=2 h
  for h in $(hosts); do
    echo "$h 10.78.0.$i ($(host_ns "$h")): $(ip -n "$SWITCH" -br link show "$(port_of "$h")" | awk '{print $2}')"
    i=$((i + 1))
  done
}

cmd="${1:-}"
shift || true
case "$cmd" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  stagectl) on_host coord "$BUILD_DIR/client/stagectl" --coordinator "$(cat "$STATE/coordinator")" "$@" ;;
  exec) host="$1"; shift; on_host "$host" "$@" ;;
  cut) ip -n "$SWITCH" link set "$(port_of "$1")" down ;;
  heal) ip -n "$SWITCH" link set "$(port_of "$1")" up ;;
  shape)
    [ "${2:-}" = --rate ] || die "usage: shape HOST --rate RATE"
    rate_limit "$(host_ns "$1")" eth0 "$3" && rate_limit "$SWITCH" "$(port_of "$1")" "$3" ;;
  *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
