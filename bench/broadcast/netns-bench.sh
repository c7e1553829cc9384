#!/usr/bin/env bash
# Weight-broadcast scaling the way a cluster sees it: the learner and up to four
# receivers each get their own "host" (a network namespace) whose link to a
# shared bridge is rate-limited with tc (default 1 Gbit/s each way), so the
# learner's link, not the 2 CPU cores, bounds every transfer. Runs
# broadcast_bench --netns inside the learner's namespace; the bench starts the
# receivers in theirs and reports, per broadcast, how many copies of the
# payload really left the learner's interface.
#
# usage: bench/broadcast/netns-bench.sh [BENCH_BINARY] [broadcast_bench args...]
#   RATE=1gbit (tc rate per link direction)
# Needs root (ip netns, tc). Uses 10.77.0.0/24 inside the namespaces only; nothing
# is routed anywhere else. Everything is torn down on exit, also on failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../../scripts/lib/netns.sh
. scripts/lib/netns.sh
BENCH="${1:-build/bench/broadcast/broadcast_bench}"
shift || true
RATE="${RATE:-1gbit}"
PREFIX="trbc"
HOSTS=(l r0 r1 r2 r3)
declare -A ADDR=([l]=10.77.0.1 [r0]=10.77.0.2 [r1]=10.77.0.3 [r2]=10.77.0.4 [r3]=10.77.0.5)

if [ "$(id -u)" -ne 0 ]; then echo "netns-bench: needs root (ip netns, tc)" >&2; exit 1; fi
if [ ! -x "$BENCH" ]; then echo "netns-bench: $BENCH not built" >&2; exit 1; fi
BENCH="$(realpath "$BENCH")"

cleanup() {
  for h in hub "${HOSTS[@]}"; do ip netns del "$PREFIX-$h" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM
cleanup  # leftovers of an interrupted run

netns_hub "$PREFIX"
for h in "${HOSTS[@]}"; do
  ns="$PREFIX-$h"
  netns_host "$PREFIX" "$h" "${ADDR[$h]}" tr0
  # The host's link: RATE out of the host and RATE into it.
  ip netns exec "$ns" tc qdisc add dev tr0 root tbf rate "$RATE" burst 512kb latency 50ms
  ip netns exec "$PREFIX-hub" tc qdisc add dev "v-$h" root tbf rate "$RATE" burst 512kb latency 50ms
done
echo "netns-bench: 5 hosts on a bridge, every link $RATE each way"

ip netns exec "$PREFIX-l" env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE "$BENCH" --netns \
  --learner-host "${ADDR[l]}" \
  --receiver-hosts "${ADDR[r0]},${ADDR[r1]},${ADDR[r2]},${ADDR[r3]}" \
  --receiver-netns "$PREFIX-r0,$PREFIX-r1,$PREFIX-r2,$PREFIX-r3" \
  --link-iface tr0 \
  --backends gloo_chain,gloo_broadcast,zmq_chain,zmq_star "$@"
