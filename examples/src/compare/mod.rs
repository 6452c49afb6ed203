//! railcompare's parts (the binary, `src/bin/railcompare.rs`, runs them in order):
//! `args` its command line, `runs` one benchmark launch per library and round and the rows it
//! reports, `stats` the medians over rounds and the ratios, `table` the side-by-side text table,
//! `plot` the SVG, `settle` the guard against spells of a slow host (a cross-core latency probe
//! around every launch).

pub mod args;
pub mod plot;
pub mod runs;
pub mod settle;
pub mod stats;
pub mod table;

/// One of the two libraries compared.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Mpi,
    Railring,
}

impl Lib {
    pub fn name(self) -> &'static str {
        match self {
            Lib::Mpi => "mpi",
            Lib::Railring => "railring",
        }
    }
}
