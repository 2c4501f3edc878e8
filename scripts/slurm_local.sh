#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, from Debian's packages (munge, slurmctld, slurmd),
# for tests of topiaryd --scheduler slurm.
#   scripts/slurm_local.sh start DIR CTLD_PORT SLURMD_PORT   # prints SLURM_CONF=DIR/slurm.conf
#   scripts/slurm_local.sh stop DIR
# DIR should have a short path (munge's socket lives there). Every daemon runs as the calling
# user, keeps its state, logs and spool in DIR, and is stopped by `stop`. No cgroups:
# processes are tracked by parentage (proctrack/linuxproc), which suits containers.
set -euo pipefail
cmd="$1"
dir="$2"
stop() {
  # Jobs first (their tasks outlive slurmd otherwise), then the daemons.
  if [ -f "$dir/slurm.conf" ]; then
    SLURM_CONF="$dir/slurm.conf" scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(SLURM_CONF="$dir/slurm.conf" squeue --noheader 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for pid in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munge/munged.pid; do
    [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
  done
  sleep 1
}
if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
ctld_port="$3"
slurmd_port="$4"
for tool in munged slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] ||
    { echo "slurm_local: $tool is missing (apt-get install munge slurmctld slurmd slurm-client)" >&2; exit 3; }
done
export PATH="$PATH:/usr/sbin"
mkdir -p "$dir"/munge "$dir"/state "$dir"/spool "$dir"/log
chmod 700 "$dir"/munge
[ -f "$dir/munge/munge.key" ] || { head -c 1024 /dev/urandom > "$dir/munge/munge.key"; chmod 400 "$dir/munge/munge.key"; }
munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munge/seed" --force
host="$(hostname)"
cat > "$dir/slurm.conf" <<CONF
ClusterName=topiarylocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
KillWait=5
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do
  if sinfo --noheader --format=%T 2>/dev/null | grep -q idle; then
    echo "SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.2
done
echo "slurm_local: the node did not come up; logs in $dir/log:" >&2
tail -n 20 "$dir"/log/*.log >&2 || true
stop
exit 1
