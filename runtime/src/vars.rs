//! The names of every environment variable in a railring job: what railrun sets for each rank
//! and every `RAILRING_*` knob the runtime reads. One constant per variable, so the launcher that
//! writes a name and the runtime that reads it cannot drift apart. Each doc line says who sets the
//! variable and who reads it (the README's table gives the defaults and value grammar).

// ------------------------------------------------------------------ set by railrun for every rank

/// This rank's number in the job, `0..RAILRING_WORLD_SIZE`. Set by railrun (per rank); read by
/// `bootstrap::launch`.
pub const RANK: &str = "RAILRING_RANK";
/// Ranks in the job. Set by railrun (job-wide); read by `bootstrap::launch`.
pub const WORLD_SIZE: &str = "RAILRING_WORLD_SIZE";
/// This rank's index among its node's ranks. Set by railrun (per rank); for the program (the
/// runtime learns local ranks from the gathered world).
pub const LOCAL_RANK: &str = "RAILRING_LOCAL_RANK";
/// Ranks on this rank's node. Set by railrun (per rank); read by `config` (the cost model raises
/// in-node latency when local ranks outnumber CPUs).
pub const LOCAL_SIZE: &str = "RAILRING_LOCAL_SIZE";
/// This rank's node's index among the job's nodes. Set by railrun (per rank); for the program.
pub const NODE_RANK: &str = "RAILRING_NODE_RANK";
/// Nodes in the job. Set by railrun (job-wide); for the program.
pub const NNODES: &str = "RAILRING_NNODES";
/// A short id naming the job (it names the node's shared-memory segment). Set by railrun
/// (job-wide); read by `bootstrap::launch`.
pub const JOB_ID: &str = "RAILRING_JOB_ID";
/// `host:port` of the bootstrap store: railrun's store for its own node's ranks, the agent's
/// relay on a remote node. Set by railrun or its agent (per node); its presence is how
/// `bootstrap::launch` knows railrun started the process.
pub const STORE_ADDR: &str = "RAILRING_STORE_ADDR";
/// The job secret both ends of every store and data connection prove. Set by railrun or its
/// agent (per node); read by `bootstrap::launch`, and by `bootstrap::launch` when set
/// by hand for srun / torchrun-style starts.
pub const JOB_SECRET: &str = "RAILRING_JOB_SECRET";
/// CPU binding mode: `none`, `auto` (the default), `hwthread`, `core`, `numa` or `socket`. Set by railrun from
/// `--bind-to` (only when given, or implied by `--map-by`); read by `config` (`Config::bind`)
/// and `railrun topo`.
pub const BIND_TO: &str = "RAILRING_BIND_TO";
/// How local ranks spread over the node's cores, sockets or NUMA nodes (`core`, `socket`,
/// `numa`, `socket:fill`, `numa:fill`, `ppr:N:socket`, `ppr:N:numa`). Set by railrun from
/// `--map-by` / `--rank-by`; read by `config` (`Config::bind`) and `railrun topo`.
pub const MAP_BY: &str = "RAILRING_MAP_BY";
/// Colour in log lines: `auto` (on a terminal, unless `NO_COLOR`), `always`, `never`. Set by
/// the user, or by railrun for its ranks (from its own stderr); read by `config`.
pub const LOG_COLOR: &str = "RAILRING_LOG_COLOR";
/// The informal standard (<https://no-color.org>): present and not empty means no colour.
/// Read by `config` and railrun.
pub const NO_COLOR: &str = "NO_COLOR";
/// OpenSSH's `client-ip client-port server-ip server-port` in processes it starts: the
/// server address is this node's management interface. Read by `config` (rail choice).
pub const SSH_CONNECTION: &str = "SSH_CONNECTION";

/// The CPUs railrun bound the rank to before exec (a CPU list, `0-3,8`), exactly what
/// `--report-bindings` shows. Set by railrun or its agent (per rank) when it bound the rank;
/// read by `bootstrap::launch` (the runtime then keeps this binding instead of computing its
/// own, see `comm::setup`).
pub const BOUND_CPUS: &str = "RAILRING_BOUND_CPUS";

/// The rank's pre-connected PMI-1 socket (Flux RFC 13; what MPICH's Hydra gives). Set by
/// railrun or its agent (per rank) for MPICH-family programs; read by `bootstrap::launch` when
/// not started by railrun (MPICH's `mpiexec`).
pub const PMI_FD: &str = "PMI_FD";
/// The rank, for PMI-1 clients. Set by railrun (per rank); read by `bootstrap::launch`.
pub const PMI_RANK: &str = "PMI_RANK";
/// The number of ranks, for PMI-1 clients. Set by railrun (job-wide); read by
/// `bootstrap::launch`.
pub const PMI_SIZE: &str = "PMI_SIZE";
/// Hydra's name for the local rank. Set by railrun (per rank), for programs.
pub const MPI_LOCALRANKID: &str = "MPI_LOCALRANKID";
/// Hydra's name for the number of local ranks. Set by railrun (per rank), for programs.
pub const MPI_LOCALNRANKS: &str = "MPI_LOCALNRANKS";
/// Open MPI's singleton server: railrun points it at a file that does not exist when it starts
/// more than one rank, so an Open MPI program it could not recognise before the start (a
/// Python script with Open MPI's mpi4py) fails in `MPI_Init` naming this path instead of
/// running as N worlds of one. Set by railrun (job-wide); read by Open MPI.
pub const OMPI_SINGLETON_SERVER: &str = "OMPI_MCA_orte_server";

/// torchrun's name for [`RANK`]. Set by railrun (per rank); read by `bootstrap::launch`
/// when the process was not started by railrun.
pub const TORCHRUN_RANK: &str = "RANK";
/// torchrun's name for [`WORLD_SIZE`]. Set by railrun (job-wide); read by
/// `bootstrap::launch` when the process was not started by railrun.
pub const TORCHRUN_WORLD_SIZE: &str = "WORLD_SIZE";
/// torchrun's name for [`LOCAL_RANK`]. Set by railrun (per rank); checked by
/// `bootstrap::launch` when present.
pub const TORCHRUN_LOCAL_RANK: &str = "LOCAL_RANK";
/// torchrun's name for [`LOCAL_SIZE`]. Set by railrun (per rank); checked by
/// `bootstrap::launch` when present.
pub const TORCHRUN_LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// Host of node 0 (torchrun's rendezvous address). Set by railrun (job-wide); read by
/// `bootstrap::launch` when the process was not started by railrun.
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// A port that was free on node 0. Set by railrun (job-wide); read by `bootstrap::launch`
/// when the process was not started by railrun.
pub const MASTER_PORT: &str = "MASTER_PORT";

/// Open MPI's name for [`RANK`]. Set by railrun (per rank), for programs written for mpirun.
pub const OMPI_COMM_WORLD_RANK: &str = "OMPI_COMM_WORLD_RANK";
/// Open MPI's name for [`WORLD_SIZE`]. Set by railrun (job-wide); `bootstrap::launch` reads it to
/// tell an mpirun start (where railrun's [`STORE_ADDR`] wins).
pub const OMPI_COMM_WORLD_SIZE: &str = "OMPI_COMM_WORLD_SIZE";
/// Open MPI's name for [`LOCAL_RANK`]. Set by railrun (per rank), for programs.
pub const OMPI_COMM_WORLD_LOCAL_RANK: &str = "OMPI_COMM_WORLD_LOCAL_RANK";
/// Open MPI's name for [`LOCAL_SIZE`]. Set by railrun (per rank), for programs.
pub const OMPI_COMM_WORLD_LOCAL_SIZE: &str = "OMPI_COMM_WORLD_LOCAL_SIZE";

// ------------------------------------------------------------------ knobs the user sets

/// Seconds without progress before a collective fails. Set by the user; read by `config`.
pub const TIMEOUT: &str = "RAILRING_TIMEOUT";
/// Seconds to reach the bootstrap store and data-plane peers. Set by the user; read by `config`.
pub const CONNECT_TIMEOUT: &str = "RAILRING_CONNECT_TIMEOUT";
/// Seconds a rail may carry data without any acknowledgement from the peer's host before its
/// links move to another rail (and, at least 2, that a move waits for the peer's answer). Set by
/// the user; read by `config`, used by `transport::failover`.
pub const RAIL_TIMEOUT: &str = "RAILRING_RAIL_TIMEOUT";
/// Every N collective calls, print which ranks arrived last and how late. Set by the user; read
/// by `config`, used by `comm::straggler`.
pub const STRAGGLER: &str = "RAILRING_STRAGGLER";
/// Force an algorithm (`two_level`, `ring`, `recursive_doubling`, `tree`). Set by the user; read
/// by `config`.
pub const ALGO: &str = "RAILRING_ALGO";
/// Cost-model calibration (`net_beta=1.25e8,...`). Set by the user; read by `config`.
pub const COST: &str = "RAILRING_COST";
/// Interfaces carrying TCP rails (NCCL grammar). Set by the user; read by `config`, used by
/// `transport::tcp` and the topology binding.
pub const SOCKET_IFNAME: &str = "RAILRING_SOCKET_IFNAME";
/// Bytes of one shared-memory staging slot. Set by the user; read by `config`.
pub const SHM_SLOT: &str = "RAILRING_SHM_SLOT";
/// `auto`, `on` or `off`: in-node collectives reading peers' buffers directly (`process_vm_readv`).
/// Set by the user; read by `config`, used by `comm::setup` and `transport::shm`.
pub const SHM_SINGLE_COPY: &str = "RAILRING_SHM_SINGLE_COPY";
/// `auto`, `on` or `off`: on two ranks, whether blocks of every size are read directly (`auto`:
/// as the node's measured kernel copy says). Set by the user; read by `config`, used by
/// `comm::setup`.
pub const SHM_SINGLE_COPY_LARGE: &str = "RAILRING_SHM_SINGLE_COPY_LARGE";
/// Bytes per pipelined chunk on network links. Set by the user; read by `config`.
pub const NET_CHUNK: &str = "RAILRING_NET_CHUNK";
/// TCP connections per peer and rail (1-16). Set by the user; read by `config`.
pub const NET_STREAMS: &str = "RAILRING_NET_STREAMS";
/// How many TCP rails each rank's links to other nodes drive (`0`: automatic, every rail shared
/// out when a node has fewer ranks than rails; `1`: one rail per rank). Set by the user; read by
/// `config`, used by `comm::setup`.
pub const RAILS_PER_RANK: &str = "RAILRING_RAILS_PER_RANK";
/// Segment size of the pipelined two-level all-reduce across nodes (`0` disables). Set by the
/// user; read by `config`.
pub const PIPELINE_SEG: &str = "RAILRING_PIPELINE_SEG";
/// Farthest GPU–NIC path class for GPUDirect RDMA (NCCL's `NCCL_NET_GDR_LEVEL` grammar). Set by
/// the user; read by `config`.
pub const NET_GDR_LEVEL: &str = "RAILRING_NET_GDR_LEVEL";
/// Log level (`WARN`, `INFO`, `DEBUG`, `TRACE`). Set by the user; read by `config`.
pub const DEBUG: &str = "RAILRING_DEBUG";
/// Subsystems to log (`init,tune,topo,net,bootstrap`). Set by the user; read by `config`.
pub const DEBUG_SUBSYS: &str = "RAILRING_DEBUG_SUBSYS";
/// Overrides the host identity, so ranks with different values form different nodes. Set by
/// the user (tests split one machine with it); read by `config` (see `machine::host_id`).
pub const HOST_ID: &str = "RAILRING_HOST_ID";
/// `ib`, `socket` or `auto`: the network between nodes. Set by the user; read by
/// `transport::rdma` (feature `rdma`).
pub const NET: &str = "RAILRING_NET";
/// RDMA devices to use (NCCL grammar). Set by the user; read by `transport::rdma`.
pub const IB_HCA: &str = "RAILRING_IB_HCA";
/// GID index for RoCE. Set by the user; read by `transport::rdma`.
pub const IB_GID_INDEX: &str = "RAILRING_IB_GID_INDEX";
/// Staging slot of the CUDA in-node fabric. Set by the user; read by `transport::cuda`
/// (feature `cuda`).
pub const GPU_SLOT: &str = "RAILRING_GPU_SLOT";
/// NCCL or hwloc topology XML used instead of sysfs. Set by the user; read by
/// `topology::Topology::discover` (so also by `railrun --report-bindings` and `railrun topo`).
pub const TOPO_FILE: &str = "RAILRING_TOPO_FILE";
/// Explicit local rank → NIC list. Set by the user; read by `config` (`Config::bind`)
/// and `railrun topo`.
pub const NIC_MAP: &str = "RAILRING_NIC_MAP";
/// The per-user key file srun / torchrun-style starts derive the job secret from. Set by the
/// user; read by `bootstrap::launch`.
pub const JOB_SECRET_FILE: &str = "RAILRING_JOB_SECRET_FILE";
/// Where rank 0 serves the bootstrap store under srun / torchrun-style starts. Set by the user;
/// read by `bootstrap::launch`.
pub const STORE_HOST: &str = "RAILRING_STORE_HOST";
/// The port of that store. Set by the user; read by `bootstrap::launch`.
pub const STORE_PORT: &str = "RAILRING_STORE_PORT";

#[cfg(test)]
mod tests {
    /// Every railring knob is spelled `RAILRING_` + its constant's name.
    #[test]
    fn railring_names_match_their_constants() {
        use super::*;
        for (name, value) in [
            ("RANK", RANK),
            ("WORLD_SIZE", WORLD_SIZE),
            ("LOCAL_RANK", LOCAL_RANK),
            ("LOCAL_SIZE", LOCAL_SIZE),
            ("NODE_RANK", NODE_RANK),
            ("NNODES", NNODES),
            ("JOB_ID", JOB_ID),
            ("STORE_ADDR", STORE_ADDR),
            ("JOB_SECRET", JOB_SECRET),
            ("BIND_TO", BIND_TO),
            ("MAP_BY", MAP_BY),
            ("LOG_COLOR", LOG_COLOR),
            ("BOUND_CPUS", BOUND_CPUS),
            ("TIMEOUT", TIMEOUT),
            ("CONNECT_TIMEOUT", CONNECT_TIMEOUT),
            ("RAIL_TIMEOUT", RAIL_TIMEOUT),
            ("STRAGGLER", STRAGGLER),
            ("ALGO", ALGO),
            ("COST", COST),
            ("SOCKET_IFNAME", SOCKET_IFNAME),
            ("SHM_SLOT", SHM_SLOT),
            ("SHM_SINGLE_COPY", SHM_SINGLE_COPY),
            ("SHM_SINGLE_COPY_LARGE", SHM_SINGLE_COPY_LARGE),
            ("NET_CHUNK", NET_CHUNK),
            ("NET_STREAMS", NET_STREAMS),
            ("RAILS_PER_RANK", RAILS_PER_RANK),
            ("PIPELINE_SEG", PIPELINE_SEG),
            ("NET_GDR_LEVEL", NET_GDR_LEVEL),
            ("DEBUG", DEBUG),
            ("DEBUG_SUBSYS", DEBUG_SUBSYS),
            ("HOST_ID", HOST_ID),
            ("NET", NET),
            ("IB_HCA", IB_HCA),
            ("IB_GID_INDEX", IB_GID_INDEX),
            ("GPU_SLOT", GPU_SLOT),
            ("TOPO_FILE", TOPO_FILE),
            ("NIC_MAP", NIC_MAP),
            ("JOB_SECRET_FILE", JOB_SECRET_FILE),
            ("STORE_HOST", STORE_HOST),
            ("STORE_PORT", STORE_PORT),
        ] {
            assert_eq!(value, format!("RAILRING_{name}"));
        }
    }
}
