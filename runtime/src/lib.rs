//! railring: collective communication for every machine.
pub mod hostlist;
pub mod topology;
pub mod bootstrap;
