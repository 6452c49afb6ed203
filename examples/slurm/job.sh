#!/bin/bash
# railring on Slurm: an allreduce benchmark over every node of the allocation, twice —
# once through railrun (one agent per node, started with srun) and once with srun alone
# (railring reads the SLURM_* variables of each task). Submit with:
#
#   sbatch examples/slurm/job.sh                 # or: sbatch -N 4 --ntasks-per-node=8 examples/slurm/job.sh
#
# railrun and railperf must be on PATH on every node (or give absolute paths below), and the
# node names must resolve on every node (see docs/slurm.md).
#SBATCH --job-name=railperf
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=00:10:00
#SBATCH --output=railperf-%j.out

set -euo pipefail

# The job secret: every task must know it, other users must not. Exported here, it reaches
# railrun and every srun task (srun passes the environment on) and nobody else.
RAILRING_JOB_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export RAILRING_JOB_SECRET

# Which interfaces carry the TCP rails (NCCL grammar); leave unset to pick automatically.
export RAILRING_SOCKET_IFNAME=${RAILRING_SOCKET_IFNAME:-rail}

# nccl-tests-style arguments; override with `sbatch --export=ALL,RAILPERF_ARGS="..."`.
read -r -a ARGS <<< "${RAILPERF_ARGS:--b 8 -e 128M -f 2 -n 20 -w 5}"

echo "== job $SLURM_JOB_ID on $SLURM_JOB_NODELIST ($SLURM_TASKS_PER_NODE tasks per node)"

# 1. railrun inside the allocation: hosts and slots come from SLURM_JOB_NODELIST /
#    SLURM_TASKS_PER_NODE, agents start with `srun --overlap` (no ssh needed).
echo "== railrun"
railrun railperf allreduce "${ARGS[@]}"

# 2. srun direct launch: no railrun; rank 0 serves the bootstrap store on the first node of the
#    step, on a port derived from the job and step ids (RAILRING_STORE_PORT overrides).
echo "== srun"
srun railperf allreduce "${ARGS[@]}"

echo "== done"
