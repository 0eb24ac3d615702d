#!/usr/bin/env bash
# A real two-node Slurm cluster on one machine, for hpcrl's own tests.
#
#   bash tests/slurm/cluster.sh install   # Debian packages (needs root, apt)
#   bash tests/slurm/cluster.sh start     # idempotent; waits until n1, n2 are idle
#   bash tests/slurm/cluster.sh status
#   bash tests/slurm/cluster.sh env       # eval "$(bash tests/slurm/cluster.sh env)"
#   bash tests/slurm/cluster.sh stop      # idempotent; leaves no netns, veth, daemon
#   bash tests/slurm/cluster.sh node-stop n2   # stop one node's slurmd (a node-failure test)
#   bash tests/slurm/cluster.sh node-start n2  # start it again and return the node to service
#
# Everything the cluster writes lives under $HPCRL_SLURM_ROOT (default /tmp/hpcrl-slurm),
# except: /etc/slurm/{slurm.conf,slurmdbd.conf,plugstack.conf.d/pyxis-standin.conf} (so plain
# sbatch/srun/sacct work from any process), tagged n1/n2 lines in /etc/hosts, and munged's
# socket at its default path in /run/munge. stop undoes all of it; $ROOT keeps the logs.
# Traffic stays on loopback and 10.77.0.0/24. One cluster per machine (fixed ports, names).
set -euo pipefail

ROOT=${HPCRL_SLURM_ROOT:-/tmp/hpcrl-slurm}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ETC=/etc/slurm
NODES=(n1 n2)
BRIDGE=hpcrl-br0
BRIDGE_IP=10.77.0.1
declare -A NODE_IP=([n1]=10.77.0.11 [n2]=10.77.0.12)
declare -A NODE_PORT=([n1]=17001 [n2]=17002) # loopback mode only: all slurmd share one IP
DB_PORT=3307
HOSTS_TAG="# hpcrl-slurm test cluster"
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server libslurm-dev gcc iproute2 shellcheck)
START_DEADLINE_S=${HPCRL_SLURM_START_DEADLINE_S:-90}

log() { printf '[cluster %5ss] %s\n' "$(elapsed)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
T0=$EPOCHREALTIME
elapsed() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

need_root() { [[ $(id -u) -eq 0 ]] || die "run as root (daemons, namespaces, /etc/slurm)"; }

# Poll a command until it succeeds or a deadline passes; readiness, never a blind sleep.
wait_for() {
  local what=$1 deadline_s=$2; shift 2
  local end=$(($(date +%s) + deadline_s))
  until "$@" >/dev/null 2>&1; do
    (($(date +%s) < end)) || die "timed out after ${deadline_s}s waiting for $what (logs: $ROOT/log, $ROOT/mysql)"
    sleep 0.2
  done
  log "$what: ready"
}

# ---------------------------------------------------------------- install
cmd_install() {
  need_root
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    log "install: all packages present"
    return
  fi
  log "install: missing ${missing[*]}"
  # apt-get update once per machine (a stamp); later installs reuse the lists.
  local stamp=/var/lib/apt/lists/.hpcrl-updated
  if [[ ! -e $stamp ]]; then
    apt-get update -qq
    touch "$stamp"
  fi
  # Post-install scripts (mariadb, munge) would start daemons on the system paths; we run our
  # own under $ROOT, so forbid that with a temporary policy-rc.d (only if none exists).
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
  if ((own_policy)); then rm -f "$policy"; fi
  ((rc == 0)) || die "apt-get install failed (exit $rc)"
  log "install: done"
}

# ---------------------------------------------------------------- layout helpers
# netns mode gives every node its own IP and hostname; loopback mode is the fallback for
# machines that refuse network namespaces (all slurmd share 127.0.0.1 and the hostname).
mode() { cat "$ROOT/mode" 2>/dev/null || echo none; }
ctl_ip() { if [[ $(mode) == netns ]]; then echo "$BRIDGE_IP"; else echo 127.0.0.1; fi; }
node_ip() { if [[ $(mode) == netns ]]; then echo "${NODE_IP[$1]}"; else echo 127.0.0.1; fi; }
node_port() { if [[ $(mode) == netns ]]; then echo 6818; else echo "${NODE_PORT[$1]}"; fi; }
pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Slurm refuses a node whose RealMemory exceeds the machine's; keep 8000 where it fits.
node_mem_mb() {
  local total_mb
  total_mb=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
  local half=$((total_mb / 2))
  ((half < 8000)) && echo "$half" || echo 8000
}

# ---------------------------------------------------------------- network
netns_supported() {
  [[ ${HPCRL_SLURM_NETNS:-1} == 1 ]] || return 1
  ip netns add hpcrl-probe 2>/dev/null || return 1
  ip netns del hpcrl-probe
}

net_up() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$BRIDGE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local n
  for n in "${NODES[@]}"; do
    ip netns add "$n"
    ip link add "hpcrl-$n" type veth peer name eth0 netns "$n"
    ip link set "hpcrl-$n" master "$BRIDGE" up
    ip -n "$n" addr add "$(node_ip "$n")/24" dev eth0
    ip -n "$n" link set eth0 up
    ip -n "$n" link set lo up
    # No default route on purpose: a node can reach only the bridge subnet.
  done
  log "network: bridge $BRIDGE $BRIDGE_IP/24, netns ${NODES[*]}"
}

veths_gone() { ! ip -o link show | grep -q ' hpcrl-n[0-9]*@'; }

net_down() {
  local n
  for n in "${NODES[@]}"; do
    if [[ -e /run/netns/$n ]]; then ip netns del "$n"; fi
  done
  # Namespace teardown is asynchronous; re-creating a veth before it is gone fails.
  wait_for "veths removed" 20 veths_gone
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
}

hosts_without_tag() { grep -vF "$HOSTS_TAG" /etc/hosts || true; }

hosts_up() {
  local new n
  new=$(hosts_without_tag)
  for n in "${NODES[@]}"; do new+=$'\n'"$(node_ip "$n") $n $HOSTS_TAG"; done
  # /etc/hosts may be a bind mount: rewrite in place, never replace the file.
  printf '%s\n' "$new" >/etc/hosts
}

hosts_down() {
  grep -qF "$HOSTS_TAG" /etc/hosts || return 0
  local new
  new=$(hosts_without_tag)
  printf '%s\n' "$new" >/etc/hosts
}

# ---------------------------------------------------------------- munge
# munged listens on the default socket: sacctmgr/sacct ignore slurm.conf's AuthInfo for
# slurmdbd connections, so a socket elsewhere breaks accounting. Key, pid and log stay in $ROOT.
MUNGE_SOCKET=/run/munge/munge.socket.2

munge_answers() { munge -n | unmunge >/dev/null; }

munge_up() {
  if munge_answers 2>/dev/null; then
    log "munged: already running on $MUNGE_SOCKET (not ours), reusing it"
    return
  fi
  install -d -o munge -g munge -m 0755 /run/munge "$ROOT/munge"
  # Our own key: the cluster must not depend on a system-wide one.
  dd if=/dev/urandom of="$ROOT/munge/munge.key" bs=1024 count=1 status=none
  chown munge:munge "$ROOT/munge/munge.key"
  chmod 0400 "$ROOT/munge/munge.key"
  runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$ROOT/munge/munge.key" \
    --pid-file="$ROOT/munge/munged.pid" --log-file="$ROOT/munge/munged.log" \
    --seed-file="$ROOT/munge/munged.seed"
  wait_for "munged" 10 munge_answers
}

# ---------------------------------------------------------------- mariadb
db_socket() { echo "$ROOT/mysql/mysqld.sock"; }

mariadb_up() {
  install -d -o mysql -g mysql -m 0750 "$ROOT/mysql" "$ROOT/mysql/data"
  mariadb-install-db --no-defaults --user=mysql --datadir="$ROOT/mysql/data" \
    --auth-root-authentication-method=socket --skip-test-db >"$ROOT/mysql/install.log" 2>&1 \
    || die "mariadb-install-db failed, see $ROOT/mysql/install.log"
  # 127.0.0.1 only, own port and socket: never collides with a system MariaDB.
  setsid mariadbd --no-defaults --user=mysql --datadir="$ROOT/mysql/data" \
    --socket="$(db_socket)" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
    --pid-file="$ROOT/mysql/mariadbd.pid" --log-error="$ROOT/mysql/mariadbd.log" \
    --innodb-buffer-pool-size=32M --innodb-log-file-size=16M --skip-log-bin \
    </dev/null >/dev/null 2>&1 &
  wait_for "mariadb" 30 mariadb-admin --no-defaults --socket="$(db_socket)" ping
  mariadb --no-defaults --socket="$(db_socket)" -u root <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$(db_password)';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
}

# A per-cluster random password; the database only listens on 127.0.0.1 anyway.
db_password() {
  if [[ ! -s $ROOT/mysql/slurm.pass ]]; then
    (umask 077 && od -An -N12 -tx1 /dev/urandom | tr -d ' \n' >"$ROOT/mysql/slurm.pass")
  fi
  cat "$ROOT/mysql/slurm.pass"
}

# ---------------------------------------------------------------- configs
# Tag every file we write in /etc/slurm so stop removes ours and never someone else's.
CONF_TAG="# written by hpcrl tests/slurm/cluster.sh"

write_slurm_conf() { slurm_conf_text >"$ETC/slurm.conf"; }

slurm_conf_text() {
  local ctl_host mem n
  ctl_host=$(hostname -s)
  mem=$(node_mem_mb)
  {
    echo "$CONF_TAG"
    echo "# root=$ROOT"
    cat <<EOF
ClusterName=hpcrl
SlurmctldHost=$ctl_host($(ctl_ip))
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool/%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups, no binding: the nodes are simulated and share the same cores.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
# Trust CPUs/RealMemory below even where the machine reports fewer.
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MailProg=/bin/true
JobCompType=jobcomp/none
# submitit's preemption/timeout path: USR2 -> scontrol requeue -> the job runs again.
# A requeued job waits cred_expire seconds (default 120) before it may start again.
JobRequeue=1
AuthInfo=cred_expire=10
MinJobAge=30
# A node whose slurmd stops answering is marked DOWN (its jobs end NODE_FAIL, requeued ones
# run again) after this long; with the default 300 s the lost-slurmd test would wait 5 min.
SlurmdTimeout=20
# Default main loop runs every 60 s: an eligible job (e.g. requeued) would idle that long.
SchedulerParameters=sched_interval=2,bf_interval=2
InactiveLimit=0
# submitit reads job states through sacct, so accounting must be real.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$(ctl_ip)
AccountingStoragePort=6819
PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP
EOF
    for n in "${NODES[@]}"; do
      if [[ $(mode) == netns ]]; then
        echo "NodeName=$n NodeAddr=$(node_ip "$n") NodeHostname=$n CPUs=2 RealMemory=$mem State=UNKNOWN"
      else
        echo "NodeName=$n NodeAddr=127.0.0.1 NodeHostname=$ctl_host Port=$(node_port "$n") CPUs=2 RealMemory=$mem State=UNKNOWN"
      fi
    done
  }
}

write_slurmdbd_conf() {
  {
    echo "$CONF_TAG"
    cat <<EOF
AuthType=auth/munge
DbdHost=$(hostname -s)
DbdAddr=$(ctl_ip)
DbdPort=6819
SlurmUser=slurm
PidFile=$ROOT/run/slurmdbd.pid
LogFile=$ROOT/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(db_password)
StorageLoc=slurm_acct_db
EOF
  } >"$ETC/slurmdbd.conf"
  # slurmdbd refuses a config holding a password that others can read.
  chown slurm:slurm "$ETC/slurmdbd.conf"
  chmod 0600 "$ETC/slurmdbd.conf"
}

PLUGSTACK_CONF=$ETC/plugstack.conf.d/pyxis-standin.conf

build_spank_plugin() {
  # Build aside, then rename: steps that already loaded the old .so keep a valid file.
  gcc -shared -fPIC -Wall -Wextra -Werror -o "$ROOT/pyxis_standin.so.new" "$HERE/pyxis_standin.c"
  mv -f "$ROOT/pyxis_standin.so.new" "$ROOT/pyxis_standin.so"
  mkdir -p "$ETC/plugstack.conf.d"
  # Debian's plugstack.conf includes plugstack.conf.d/*.conf; create it where it is missing.
  [[ -e $ETC/plugstack.conf ]] || echo "include $ETC/plugstack.conf.d/*.conf" >"$ETC/plugstack.conf"
  printf '%s\nrequired %s\n' "$CONF_TAG" "$ROOT/pyxis_standin.so" >"$PLUGSTACK_CONF"
  log "spank: built $ROOT/pyxis_standin.so, listed in $PLUGSTACK_CONF"
}

remove_our_etc_files() {
  local f
  for f in "$ETC/slurm.conf" "$ETC/slurmdbd.conf" "$PLUGSTACK_CONF"; do
    if [[ -e $f ]] && head -n1 "$f" | grep -qF "$CONF_TAG"; then rm -f "$f"; fi
  done
}

# ---------------------------------------------------------------- slurm daemons
sacct_answers() { sacct -n -X -S now-1minutes >/dev/null; }
slurmctld_answers() { scontrol ping | grep -q 'is UP'; }

nodes_idle() {
  [[ $(sinfo -h -N -p debug -o '%N %t' | sort -u) == "$(printf '%s idle\n' "${NODES[@]}")" ]]
}

slurmdbd_up() {
  slurmdbd
  wait_for "slurmdbd" 30 sacctmgr -n list cluster
  # Register before slurmctld starts so its first registration finds the cluster.
  sacctmgr -i add cluster hpcrl >/dev/null
  sacctmgr -i add account hpcrl Cluster=hpcrl Description=tests Organization=hpcrl >/dev/null
  sacctmgr -i add user root Account=hpcrl DefaultAccount=hpcrl >/dev/null
}

slurmd_up() {
  local n=$1
  install -d -m 0755 "$ROOT/spool/$n"
  if [[ $(mode) == netns ]]; then
    # Not `ip netns exec`: it remounts /sys, hides cgroups and slurmd dies at start.
    nsenter --net="/run/netns/$n" unshare --uts sh -c "hostname $n && exec slurmd -N $n"
  else
    slurmd -N "$n"
  fi
}

# ---------------------------------------------------------------- commands
# Ports, /etc/slurm, the netns names and /run/munge are machine-wide: one cluster at a time.
refuse_other_cluster() {
  local other
  [[ -e $ETC/slurm.conf ]] || return 0
  other=$(sed -n 's/^# root=//p' "$ETC/slurm.conf" | head -n1)
  if [[ -n $other && $other != "$ROOT" ]] && pid_alive "$other/run/slurmctld.pid"; then
    die "a test cluster from $other is running; stop it first: HPCRL_SLURM_ROOT=$other $0 stop"
  fi
}

healthy() {
  [[ -e $ETC/slurm.conf ]] && pid_alive "$ROOT/run/slurmctld.pid" && pid_alive "$ROOT/run/slurmdbd.pid" \
    && nodes_idle_or_busy && sacct_answers
}

# A running cluster with jobs on it is healthy too: start must not disturb other users.
nodes_idle_or_busy() {
  local bad
  bad=$(sinfo -h -N -p debug -o '%t' | grep -cvE '^(idle|alloc|mix|comp)$' || true)
  [[ $(sinfo -h -N -p debug -o '%N' | sort -u | wc -l) -eq ${#NODES[@]} && $bad -eq 0 ]]
}

cmd_start() {
  need_root
  refuse_other_cluster
  if healthy 2>/dev/null; then
    # slurmstepd loads plugstack plugins per step, so a rebuilt stand-in applies at once.
    if [[ $HERE/pyxis_standin.c -nt $ROOT/pyxis_standin.so ]]; then build_spank_plugin; fi
    # A settings change in this script reaches a running cluster without disturbing its jobs.
    if [[ $(slurm_conf_text) != "$(cat "$ETC/slurm.conf")" ]]; then
      write_slurm_conf
      scontrol reconfigure
      log "start: slurm.conf changed, applied with scontrol reconfigure"
    fi
    log "start: already running ($(mode) mode), nothing else to do"
    return
  fi
  cmd_stop quiet
  rm -rf "$ROOT"
  mkdir -p "$ROOT" "$ETC"
  chmod 0755 "$ROOT"
  install -d -o slurm -g slurm "$ROOT/state" "$ROOT/log" "$ROOT/run"
  if netns_supported; then echo netns >"$ROOT/mode"; else echo loopback >"$ROOT/mode"; fi
  log "start: mode $(mode), root $ROOT"
  [[ $(mode) == netns ]] && net_up
  hosts_up
  munge_up
  mariadb_up
  write_slurm_conf
  write_slurmdbd_conf
  build_spank_plugin
  slurmdbd_up
  slurmctld
  wait_for "slurmctld" 30 slurmctld_answers
  local n
  for n in "${NODES[@]}"; do slurmd_up "$n"; done
  wait_for "nodes ${NODES[*]} idle" "$START_DEADLINE_S" nodes_idle
  wait_for "sacct" 30 sacct_answers
  sinfo -N -o '%N %t %c %m %P' >&2
}

# TERM daemons from their pid files, wait for all to exit (in parallel: each takes ~2 s to
# shut down), KILL what is left after a deadline.
stop_pidfiles() {
  local f pids=() names=() end
  for f in "$@"; do
    if pid_alive "$f"; then pids+=("$(cat "$f")") && names+=("${f##*/}"); fi
  done
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  end=$(($(date +%s) + 15))
  while kill -0 "${pids[@]}" 2>/dev/null; do
    if (($(date +%s) >= end)); then kill -KILL "${pids[@]}" 2>/dev/null || true; break; fi
    sleep 0.1
  done
  log "stopped ${names[*]%.pid}"
}

cmd_stop() {
  need_root
  refuse_other_cluster
  local n
  # Jobs first, so no slurmstepd outlives its slurmd.
  if [[ -e $ETC/slurm.conf ]] && pid_alive "$ROOT/run/slurmctld.pid"; then
    scancel --full --quiet --user=root 2>/dev/null || true
  fi
  local slurmd_pids=()
  for n in "${NODES[@]}"; do slurmd_pids+=("$ROOT/run/slurmd-$n.pid"); done
  stop_pidfiles "${slurmd_pids[@]}"
  for n in "${NODES[@]}"; do
    # Whatever is still inside a node's namespace belongs to that node (slurmstepd, tasks).
    if [[ -e /run/netns/$n ]]; then
      ip netns pids "$n" | xargs -r kill -KILL 2>/dev/null || true
    fi
  done
  # Order matters: slurmctld reports to slurmdbd, which writes to MariaDB; all use munge.
  stop_pidfiles "$ROOT/run/slurmctld.pid"
  stop_pidfiles "$ROOT/run/slurmdbd.pid"
  stop_pidfiles "$ROOT/mysql/mariadbd.pid" "$ROOT/munge/munged.pid"
  net_down
  hosts_down
  remove_our_etc_files
  [[ ${1:-} == quiet ]] || log "stop: daemons stopped, netns/bridge removed, /etc/hosts restored"
}

# One node's slurmd stops; its job steps (slurmstepd, tasks) run on, as on a real node.
cmd_node_stop() {
  need_root
  local n=${1:?node name}
  stop_pidfiles "$ROOT/run/slurmd-$n.pid"
}

node_state() { sinfo -h -N -n "$1" -o '%t' | head -n1; }
node_registered() { [[ $(node_state "$1") != *'*' ]]; }
node_usable() { [[ $(node_state "$1") =~ ^(idle|alloc|mix)$ ]]; }

# Drained while its slurmd registers (slurmctld then ends any stale step of a job that has
# moved on: a requeued job starting there at once would have its new step killed with it),
# then returned to service as an admin does.
cmd_node_start() {
  need_root
  local n=${1:?node name}
  if ! pid_alive "$ROOT/run/slurmd-$n.pid"; then
    scontrol update nodename="$n" state=drain reason="hpcrl test: slurmd restarting" || true
    slurmd_up "$n"
    wait_for "slurmd $n registered" 60 node_registered "$n"
  fi
  if ! node_usable "$n"; then scontrol update nodename="$n" state=resume; fi
  wait_for "node $n usable" 60 node_usable "$n"
}

cmd_status() {
  local d
  echo "root: $ROOT  mode: $(mode)"
  for d in munge/munged mysql/mariadbd run/slurmdbd run/slurmctld run/slurmd-n1 run/slurmd-n2; do
    if pid_alive "$ROOT/$d.pid"; then echo "  ${d##*/}: running (pid $(cat "$ROOT/$d.pid"))"; else echo "  ${d##*/}: down"; fi
  done
  if [[ -e $ETC/slurm.conf ]]; then sinfo -N -o '%N %t %c %m %P' 2>&1 | sed 's/^/  /'; fi
  if healthy 2>/dev/null; then echo "healthy"; else echo "not healthy"; return 1; fi
}

cmd_env() {
  echo "export HPCRL_SLURM_ROOT=$ROOT"
  echo "export HPCRL_SLURM_MODE=$(mode)"
  # slurm.conf lives at the default path, so sbatch/srun/sacct need no SLURM_CONF.
  echo "unset SLURM_CONF"
}

main() {
  local cmd=${1:-}
  case $cmd in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status && return ;;
    env) cmd_env && return ;;
    node-stop) cmd_node_stop "${2:-}" ;;
    node-start) cmd_node_start "${2:-}" ;;
    *) echo "usage: $0 {install|start|stop|status|env|node-stop NODE|node-start NODE}" >&2; exit 2 ;;
  esac
  log "$cmd finished"
}

main "$@"
