#!/usr/bin/env bash
# A small cluster on one machine: every "host" is a network namespace with its
# own address on a private bridge, its own host name (UTS namespace) and a real
# OpenSSH daemon; optionally a real Slurm (munged + slurmctld + one slurmd per
# host). The multi-node tests (tests/multinode/) drive it; you can use it by
# hand too (docs/multinode.md).
#
#   netns-cluster.sh up DIR [--hosts "h1 h2 h3"] [--refusing "h9"] [--slurm]
#                           [--private PATH] [--watch PID]
#   netns-cluster.sh down DIR            tear everything down (idempotent)
#   netns-cluster.sh cut DIR HOST        unplug HOST's link (a network partition)
#   netns-cluster.sh restore DIR HOST    plug it back
#   netns-cluster.sh exec DIR HOST CMD.. run CMD inside HOST (its network, name, mounts)
#
# Layout (all inside namespaces; the root namespace is never touched, nothing
# is routed anywhere else):
#   <tag>-hub    a bridge `br0`; one veth per host, named v-<host>
#   <tag>-head   10.78.0.1  the launch node (troupe run, salloc, the tests' CLI)
#   <tag>-ctl    10.78.0.2  slurmctld and munged (with --slurm)
#   <tag>-<h>    10.78.0.11, .12, ...  sshd (and slurmd) as host <h>
# Hosts given with --refusing run an sshd that accepts no key (a host that
# refuses). --private PATH mounts an empty tmpfs on PATH inside every ssh host,
# so those hosts do not share that folder with the head (no shared run folder).
# DIR receives: cluster.env (addresses), ssh/ (client key, known_hosts,
# ssh_config), slurm/ (slurm.conf, logs), munge/, logs/. --watch PID starts a
# watchdog that runs `down` when PID exits, so a crashed test leaves nothing.
# Needs root (ip netns, unshare, nsenter).
set -euo pipefail

SELF="$(readlink -f "$0")"
# shellcheck source=../../scripts/lib/netns.sh
. "$(dirname "$SELF")/../../scripts/lib/netns.sh"
SUBNET=10.78.0
die() { echo "netns-cluster: $*" >&2; exit 1; }

load_env() {
  [ -f "$1/cluster.env" ] || die "no cluster in $1 (cluster.env missing)"
  # shellcheck disable=SC1091
  . "$1/cluster.env"
}

# Starts `sleep infinity` in the network namespace of $1 with its own UTS (host
# name $2) and mount namespace; prints its pid once the namespaces are set up.
# Extra arguments are mount points that get a private, empty tmpfs.
start_anchor() {
  local ns=$1 name=$2 fifo
  shift 2
  fifo=$(mktemp -u "$DIR/run/anchor.XXXXXX")
  mkfifo "$fifo"
  local mounts=""
  for m in "$@"; do mounts+="mkdir -p '$m' && mount -t tmpfs -o size=512m,mode=0755 tmpfs '$m' && "; done
  # nsenter, not `ip netns exec`: the latter remounts /sys, hiding /sys/fs/cgroup (slurmd needs it).
  nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private -- \
    sh -c "hostname '$name' && ${mounts} echo ready > '$fifo' && exec sleep infinity" \
    >/dev/null 2>&1 </dev/null &
  local pid=$!
  local line=""
  read -r -t 20 line <"$fifo" || true
  rm -f "$fifo"
  [ "$line" = ready ] || die "host $name did not come up"
  echo "$pid"
}

in_host() {  # in_host ANCHOR_PID CMD... : run CMD in that host's namespaces
  local pid=$1
  shift
  nsenter -t "$pid" -u -m -n -- "$@"
}

wait_ssh() {  # wait_ssh HOST : until sshd answers (bounded)
  local h=$1 i
  for i in $(seq 1 100); do
    if ip netns exec "$TAG-head" ssh -F "$DIR/ssh/ssh_config" -o BatchMode=yes "$h" true \
      >/dev/null 2>&1; then return 0; fi
    sleep 0.1  # polling a daemon's port: it offers nothing to wait on
  done
  die "sshd on $h did not answer within 10 s"
}

wait_port() {  # wait_port NS ADDR PORT
  local i
  for i in $(seq 1 100); do
    if ip netns exec "$1" bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then return 0; fi
    sleep 0.1  # polling a daemon's port: it offers nothing to wait on
  done
  die "nothing listens on $2:$3 after 10 s"
}

cmd_up() {
  DIR=$(readlink -f "$1")
  shift
  local hosts="h1 h2 h3" refusing="" slurm=0 private="" watch=""
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) hosts=$2; shift 2 ;;
      --refusing) refusing=$2; shift 2 ;;
      --slurm) slurm=1; shift ;;
      --private) private=$2; shift 2 ;;
      --watch) watch=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  [ "$(id -u)" -eq 0 ] || die "needs root"
  [ -e "$DIR/cluster.env" ] && die "$DIR already holds a cluster (run down first)"
  mkdir -p "$DIR"/{run,logs,ssh}
  TAG="tmn$(printf '%05x' $((($$ ^ RANDOM) & 0xfffff)))"
  local all="$hosts $refusing"
  {
    echo "TAG=$TAG"
    echo "DIR=$DIR"
    echo "HOSTS=\"$hosts\""
    echo "REFUSING=\"$refusing\""
    echo "SLURM=$slurm"
    echo "HEAD_ADDR=$SUBNET.1"
    echo "CTL_ADDR=$SUBNET.2"
  } >"$DIR/cluster.env"
  # From here on a failure tears down what exists (KEEP_ON_FAILURE=1 keeps it to debug).
  UP_DONE=0
  trap 'if [ "$UP_DONE" = 0 ] && [ "${KEEP_ON_FAILURE:-0}" != 1 ]; then
          echo "netns-cluster: setup failed; tearing down" >&2; cmd_down "$DIR"; fi' EXIT

  netns_hub "$TAG"
  local i=11
  add_host() {  # add_host NAME ADDR
    netns_host "$TAG" "$1" "$2" eth0
    echo "ADDR_$1=$2" >>"$DIR/cluster.env"
  }
  add_host head "$SUBNET.1"
  add_host ctl "$SUBNET.2"
  for h in $all; do
    add_host "$h" "$SUBNET.$i"
    i=$((i + 1))
  done

  # ssh: one client key, one host key per host, a known_hosts and an ssh_config
  # that names every host (the spawner reads it with cluster.ssh_config).
  ssh-keygen -q -t ed25519 -N '' -C troupe-test -f "$DIR/ssh/id_ed25519"
  cp "$DIR/ssh/id_ed25519.pub" "$DIR/ssh/authorized_keys"
  : >"$DIR/ssh/authorized_keys.none"
  : >"$DIR/ssh/known_hosts"
  : >"$DIR/ssh/ssh_config"
  for h in $all; do
    local addr_var="ADDR_$h"
    local addr
    addr=$(. "$DIR/cluster.env"; echo "${!addr_var}")
    ssh-keygen -q -t ed25519 -N '' -C "$h" -f "$DIR/ssh/host-$h"
    echo "$h,$addr $(cut -d' ' -f1,2 "$DIR/ssh/host-$h.pub")" >>"$DIR/ssh/known_hosts"
    printf 'Host %s\n  HostName %s\n' "$h" "$addr" >>"$DIR/ssh/ssh_config"
  done
  cat >>"$DIR/ssh/ssh_config" <<EOF
Host *
  User root
  IdentityFile $DIR/ssh/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $DIR/ssh/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  CheckHostIP no
  ConnectTimeout 3
  LogLevel ERROR
EOF
  mkdir -p /run/sshd  # sshd's privilege-separation directory (Debian creates it at boot)

  local mounts=()
  [ -n "$private" ] && mounts=("$private")
  for h in $all; do
    local addr_var="ADDR_$h" addr anchor keys=authorized_keys
    addr=$(. "$DIR/cluster.env"; echo "${!addr_var}")
    case " $refusing " in *" $h "*) keys=authorized_keys.none ;; esac
    cat >"$DIR/ssh/sshd_config-$h" <<EOF
Port 22
ListenAddress $addr
HostKey $DIR/ssh/host-$h
PidFile $DIR/run/sshd-$h.pid
AuthorizedKeysFile $DIR/ssh/$keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
MaxStartups 200
MaxSessions 200
LogLevel INFO
EOF
    anchor=$(start_anchor "$TAG-$h" "$h" "${mounts[@]}")
    echo "ANCHOR_$h=$anchor" >>"$DIR/cluster.env"
    in_host "$anchor" /usr/sbin/sshd -D -f "$DIR/ssh/sshd_config-$h" -E "$DIR/logs/sshd-$h.log" \
      </dev/null >/dev/null 2>&1 &
  done
  local anchor
  anchor=$(start_anchor "$TAG-head" head)
  echo "ANCHOR_head=$anchor" >>"$DIR/cluster.env"
  for h in $hosts; do wait_ssh "$h"; done
  for h in $refusing; do wait_port "$TAG-head" "$(. "$DIR/cluster.env"; v="ADDR_$h"; echo "${!v}")" 22; done

  [ "$slurm" = 1 ] && slurm_up "$hosts"
  if [ -n "$watch" ]; then
    # Runs `down` when the test process ends, however it ends.
    setsid bash -c "tail --pid=$watch -f /dev/null; exec '$SELF' down '$DIR'" \
      </dev/null >>"$DIR/logs/watchdog.log" 2>&1 &
    echo "WATCHDOG=$!" >>"$DIR/cluster.env"
  fi
  UP_DONE=1
  echo "netns-cluster: up in $DIR (tag $TAG): hosts $hosts${refusing:+, refusing $refusing}$([ "$slurm" = 1 ] && echo ", slurm")"
}

slurm_up() {
  local hosts=$1
  mkdir -p "$DIR"/{munge,slurm/state}
  chmod 0755 "$DIR/munge"
  mungekey --create --keyfile="$DIR/munge/munge.key" --force >/dev/null 2>&1 ||
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 0600 "$DIR/munge/munge.key"
  local ctl
  ctl=$(start_anchor "$TAG-ctl" ctl)
  echo "ANCHOR_ctl=$ctl" >>"$DIR/cluster.env"
  in_host "$ctl" munged --force --socket="$DIR/munge/munge.socket" \
    --key-file="$DIR/munge/munge.key" --pid-file="$DIR/munge/munged.pid" \
    --log-file="$DIR/logs/munged.log" --seed-file="$DIR/munge/seed" </dev/null >/dev/null 2>&1
  : >"$DIR/slurm/plugstack.conf"
  cat >"$DIR/slurm/slurm.conf" <<EOF
# Written by tests/multinode/netns-cluster.sh for a throw-away test cluster.
ClusterName=troupe$TAG
SlurmctldHost=ctl($SUBNET.2)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/slurm/state
SlurmdSpoolDir=$DIR/slurm/spool-%n
SlurmctldPidFile=$DIR/slurm/slurmctld.pid
SlurmdPidFile=$DIR/slurm/slurmd-%n.pid
SlurmctldLogFile=$DIR/logs/slurmctld.log
SlurmdLogFile=$DIR/logs/slurmd-%n.log
PlugStackConfig=$DIR/slurm/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=3
MinJobAge=10
SlurmdParameters=config_overrides
EOF
  local names=""
  for h in $hosts; do
    local v="ADDR_$h"
    echo "NodeName=$h NodeAddr=$(. "$DIR/cluster.env"; echo "${!v}") CPUs=8 RealMemory=1000 State=UNKNOWN" \
      >>"$DIR/slurm/slurm.conf"
    names+="${names:+,}$h"
    mkdir -p "$DIR/slurm/spool-$h"
  done
  echo "PartitionName=troupe Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" \
    >>"$DIR/slurm/slurm.conf"
  echo "SLURM_CONF=$DIR/slurm/slurm.conf" >>"$DIR/cluster.env"
  in_host "$ctl" env SLURM_CONF="$DIR/slurm/slurm.conf" slurmctld -D -i -f "$DIR/slurm/slurm.conf" \
    </dev/null >>"$DIR/logs/slurmctld.out" 2>&1 &
  wait_port "$TAG-head" "$SUBNET.2" 6817
  for h in $hosts; do
    local v="ANCHOR_$h"
    local anchor
    anchor=$(. "$DIR/cluster.env"; echo "${!v}")
    in_host "$anchor" env SLURM_CONF="$DIR/slurm/slurm.conf" slurmd -D -f "$DIR/slurm/slurm.conf" \
      </dev/null >>"$DIR/logs/slurmd-$h.out" 2>&1 &
  done
  # Every node idle before anyone submits.
  local i
  for i in $(seq 1 150); do
    local idle
    idle=$(ip netns exec "$TAG-head" env SLURM_CONF="$DIR/slurm/slurm.conf" \
      sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l || true)
    [ "$idle" -ge "$(echo "$hosts" | wc -w)" ] && return 0
    sleep 0.2  # polling slurmctld's view of the nodes: it offers nothing to wait on
  done
  ip netns exec "$TAG-head" env SLURM_CONF="$DIR/slurm/slurm.conf" sinfo -N >&2 || true
  die "slurm nodes did not become idle within 30 s (see $DIR/logs/)"
}

cmd_down() {
  local dir
  dir=$(readlink -f "$1")
  [ -f "$dir/cluster.env" ] || return 0
  (
    set +e
    load_env "$dir"
    if [ -n "${WATCHDOG:-}" ] && [ "$WATCHDOG" != "$$" ] && [ "$WATCHDOG" != "$PPID" ]; then
      kill "$WATCHDOG" 2>/dev/null
    fi
    # Every process in our namespaces was started by this cluster: daemons,
    # ssh sessions, actors, slurmstepd. Kill them all, then the namespaces.
    for ns in $(ip netns list | awk '{print $1}' | grep "^$TAG-"); do
      pids=$(ip netns pids "$ns" 2>/dev/null)
      [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    done
    for ns in $(ip netns list | awk '{print $1}' | grep "^$TAG-"); do
      for i in 1 2 3 4 5 6 7 8 9 10; do
        [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
        sleep 0.1  # SIGKILLed processes vanish within moments; nothing to wait on
      done
      ip netns del "$ns"
    done
    rm -f "$dir/cluster.env"
    echo "netns-cluster: down ($TAG)"
  )
}

cmd_link() {  # cmd_link DIR HOST up|down
  load_env "$(readlink -f "$1")"
  ip netns list | grep -q "^$TAG-$2\b" || die "no host $2"
  ip -n "$TAG-hub" link set "v-$2" "$3"
}

cmd_exec() {
  local dir
  dir=$(readlink -f "$1")
  load_env "$dir"
  local v="ANCHOR_$2"
  [ -n "${!v:-}" ] || die "no host $2"
  local pid=${!v}
  shift 2
  exec nsenter -t "$pid" -u -m -n -- "$@"
}

case "${1:-}" in
  up) shift; [ $# -ge 1 ] || die "usage: up DIR [options]"; cmd_up "$@" ;;
  down) [ $# -eq 2 ] || die "usage: down DIR"; cmd_down "$2" ;;
  cut) [ $# -eq 3 ] || die "usage: cut DIR HOST"; cmd_link "$2" "$3" down ;;
  restore) [ $# -eq 3 ] || die "usage: restore DIR HOST"; cmd_link "$2" "$3" up ;;
  exec) [ $# -ge 4 ] || die "usage: exec DIR HOST CMD..."; shift; cmd_exec "$@" ;;
  *) sed -n '2,30p' "$SELF" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
