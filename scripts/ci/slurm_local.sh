#!/usr/bin/env bash
# A real single-machine Slurm for the launcher's tests: munge, slurmctld and two slurmd
# (nodes n1 and n2 on this one host, one port each), configured in a folder of its own.
# Usage: scripts/ci/slurm_local.sh DIR   (prints the SLURM_CONF to export; idempotent)
set -euo pipefail
dir=${1:?usage: slurm_local.sh DIR}
mkdir -p "$dir"/{spool,state,log}
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 4 ))
cat > "$dir/slurm.conf" <<CONF
ClusterName=tuner
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
InactiveLimit=0
KillWait=5
MinJobAge=30
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=16821 CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=16822 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=tuner Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF="$dir/slurm.conf"
if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  [ -s /etc/munge/munge.key ] || mungekey --create --force 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged
fi
mkdir -p "$dir/spool/n1" "$dir/spool/n2"
pgrep -f "slurmctld -f $dir/slurm.conf" >/dev/null || slurmctld -f "$dir/slurm.conf"
for n in n1 n2; do
  pgrep -f "slurmd -f $dir/slurm.conf -N $n" >/dev/null || slurmd -f "$dir/slurm.conf" -N "$n"
done
for _ in $(seq 60); do
  if [ "$(sinfo -h -o '%T' -p tuner 2>/dev/null | sort -u | tr -d '\n')" = "idle" ]; then
    echo "$dir/slurm.conf"; exit 0
  fi
  sleep 1
done
echo "slurm_local.sh: the nodes did not come up idle:" >&2
sinfo >&2 || true
tail -20 "$dir"/log/*.log >&2
exit 1
