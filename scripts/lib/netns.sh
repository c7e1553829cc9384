# Hosts on one machine for tests and benchmarks: each "host" is a network
# namespace <prefix>-<name> with one veth (named IFACE inside it) plugged into a
# bridge br0 in <prefix>-hub. Every link is created directly inside the
# namespaces: the root namespace is never touched, nothing is routed anywhere
# else. Sourced by tests/multinode/netns-cluster.sh and
# bench/broadcast/netns-bench.sh; needs root.

# netns_hub PREFIX: the hub namespace and its bridge.
netns_hub() {
  ip netns add "$1-hub"
  ip -n "$1-hub" link set lo up
  ip -n "$1-hub" link add br0 type bridge
  ip -n "$1-hub" link set br0 up
}

# netns_host PREFIX NAME ADDR IFACE: host NAME with ADDR/24 on IFACE, its
# hub-side end v-NAME on the bridge.
netns_host() {
  ip netns add "$1-$2"
  ip link add "v-$2" netns "$1-hub" type veth peer name "$4" netns "$1-$2"
  ip -n "$1-hub" link set "v-$2" master br0 up
  ip -n "$1-$2" link set lo up
  ip -n "$1-$2" addr add "$3/24" dev "$4"
  ip -n "$1-$2" link set "$4" up
}
