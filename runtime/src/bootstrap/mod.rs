//! Bootstrap: how ranks of a job find each other. [`launch`] decides how the process was
//! started; [`join`] (or [`mpi`], feature `mpi`) turns that into a [`Rendezvous`] — this rank's
//! place in the world and a connected, authenticated store ([`crate::store`]) — from which the
//! communicator builds itself (`comm::setup`). Bootstrap never builds a communicator.

pub mod launch;
#[cfg(feature = "mpi")]
pub mod mpi;
mod offer;
pub mod pmi;

pub use launch::Launch;

use crate::error::{Error, Result};
use crate::store::{self, Store, StoreClient};
use std::sync::Arc;
use std::time::Duration;

/// What a bootstrap hands the communicator.
pub struct Rendezvous {
    pub rank: usize,
    pub size: usize,
    /// The job's store, connected and authenticated.
    pub store: Arc<StoreClient>,
    pub secret: String,
    /// The job id (ASCII alphanumerics, at most 32): names shared-memory segments.
    pub job: String,
    /// The store this rank serves (rank 0 under srun, torchrun-style env or MPI): it must live
    /// as long as the communicator.
    pub server: Option<store::ServerHandle>,
}

/// Join the job `launch` describes: connect to its store (on rank 0 of a hosted store, serve it
/// first; for [`Launch::Pmi`], through the PMI server, [`pmi`]). `Ok(None)` for
/// [`Launch::Alone`]. [`Launch::Mpi`] goes through [`mpi`] instead.
pub fn join(launch: Launch, connect_timeout: Duration) -> Result<Option<Rendezvous>> {
    let (rank, size, store_addr, secret, job, server) = match launch {
        Launch::Alone => return Ok(None),
        Launch::Mpi { source } => {
            return Err(Error::Invalid(format!(
                "started by an MPI launcher ({source} is set): the MPI bootstrap joins such jobs, not the store"
            )))
        }
        Launch::Pmi { rank, size, fd } => {
            return pmi::rendezvous(rank, size, fd, connect_timeout).map(Some)
        }
        Launch::Store {
            rank,
            size,
            store_addr,
            secret,
            job_id,
            source,
        } => {
            tracing::info!(target: "railring::init", rank, size, "bootstrap via {source} store at {store_addr}");
            (rank, size, store_addr, secret, job_id, None)
        }
        Launch::HostedStore {
            rank,
            size,
            store_addr,
            serve_on,
            secret,
            job_id,
            source,
        } => {
            let server = if rank == 0 {
                Some(serve_store(rank, &serve_on, &secret, source)?)
            } else {
                None
            };
            tracing::info!(target: "railring::init", rank, size, "bootstrap via {source}: store at {store_addr}");
            (rank, size, store_addr, secret, job_id, server)
        }
    };
    let store = Arc::new(StoreClient::connect(&store_addr, &secret, connect_timeout)?);
    Ok(Some(Rendezvous {
        rank,
        size,
        store,
        secret,
        job,
        server,
    }))
}

/// Rank 0 of a hosted store: serve the job's store on `serve_on`.
fn serve_store(
    rank: usize,
    serve_on: &str,
    secret: &str,
    source: &str,
) -> Result<store::ServerHandle> {
    let l = std::net::TcpListener::bind(serve_on).map_err(|e| Error::Transport {
        rank,
        what: format!("rank 0 serving the bootstrap store on {serve_on} ({source})"),
        err: e,
    })?;
    store::serve(l, secret, Store::new()).map_err(|e| Error::Transport {
        rank,
        what: "starting the store".into(),
        err: e,
    })
}
