//! railrun: the launcher library (CLI, host sources, placement, spawn, agent, store server).
pub mod hosts;
pub mod placement;
pub mod topo_cmd;
