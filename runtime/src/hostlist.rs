//! Slurm hostlist grammar (filled in by the host-sources work).
