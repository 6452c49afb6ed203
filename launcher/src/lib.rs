//! railrun: the launcher library (CLI, host sources, placement, spawn, agent, store server).
pub mod host_source;
pub mod placement;
pub mod plan;
pub mod topo_cmd;

pub mod agent;
pub mod bind;
pub mod cli;
pub mod doctor;
pub mod job;
pub mod node_ranks;
pub mod pmi;
pub mod proto;
pub mod signals;
pub mod spawn;
pub mod stdio;
