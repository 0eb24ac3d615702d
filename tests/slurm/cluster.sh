#!/usr/bin/env bash
# A real two-node Slurm cluster on one machine, for hpcrl's own tests.
#
#   bash tests/slurm/cluster.sh install   # Debian packages (needs root, apt)
#   bash tests/slurm/cluster.sh start     # idempotent; waits until n1, n2 are idle
#   bash tests/slurm/cluster.sh status
#   bash tests/slurm/cluster.sh env       # eval "$(bash tests/slurm/cluster.sh env)"
#   bash tests/slurm/cluster.sh stop      # idempotent; leaves no netns, veth, daemon
#
# Everything the cluster writes lives under $HPCRL_SLURM_ROOT (default /tmp/hpcrl-slurm),
# except /etc/slurm/{slurm,slurmdbd,plugstack}.conf (so plain sbatch/srun work from any
# process) and tagged n1/n2 lines in /etc/hosts. Traffic stays on loopback and 10.77.0.0/24.
set -euo pipefail

ROOT=${HPCRL_SLURM_ROOT:-/tmp/hpcrl-slurm}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ETC=/etc/slurm
NODES=(n1 n2)
BRIDGE=hpcrl-br0
BRIDGE_IP=10.77.0.1
NODE_IP_n1=10.77.0.11
NODE_IP_n2=10.77.0.12
NODE_PORT_n1=17001 # ports only matter in loopback mode (all slurmd share one IP)
NODE_PORT_n2=17002
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
    (($(date +%s) < end)) || die "timed out after ${deadline_s}s waiting for $what"
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
  # One apt-get update per boot is enough; a stamp avoids re-downloading lists.
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
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { ((own_policy)) && rm -f "$policy"; die "apt-get install failed"; }
  ((own_policy)) && rm -f "$policy"
  log "install: done"
}

main() {
  local cmd=${1:-}
  case $cmd in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *) echo "usage: $0 {install|start|stop|status|env}" >&2; exit 2 ;;
  esac
  log "$cmd finished"
}

main "$@"
