//! Bootstrap from MPI (cargo feature `mpi`): jobs started by `mpirun` / `mpiexec` (Open MPI,
//! MPICH, Intel MPI, or `srun --mpi=pmix`) need no railrun and no extra environment.
//!
//! # Design
//!
//! MPI is used for one thing only: to hand every rank the address of a railring bootstrap
//! store. The data plane (shared memory, TCP rails) stays railring's own, exactly as under
//! railrun.
//!
//! 1. Rank 0 of the MPI communicator starts a bootstrap store and describes it in a small JSON
//!    record ([`super::offer`]: its addresses, network namespace, the job secret and id — or the
//!    error, so no rank is left waiting in `MPI_Bcast`).
//! 2. Rank 0 broadcasts the record over MPI (`MPI_Bcast`).
//! 3. Every rank tries the offered addresses (loopback only within rank 0's network namespace;
//!    attached subnets first; see [`super::offer`]) until one passes the secret handshake.
//! 4. Every rank returns a [`Rendezvous`] with that store, its MPI rank and size, from which the
//!    communicator builds itself. Rank 0's store server lives as long as the communicator
//!    (split() uses the store too).
//!
//! The secret travels inside MPI's own channel, which has the same trust as railrun's
//! environment (both come from the launcher that started the job).
//!
//! # MPI's lifetime
//!
//! * [`Communicator::from_mpi`](crate::Communicator::from_mpi): the caller owns MPI (its `Universe`); railring never
//!   initializes or finalizes it and uses only the communicator it is given (any communicator:
//!   the railring world is that communicator's ranks, in its rank order).
//! * [`Communicator::init`](crate::Communicator::init) under mpirun: if the program already initialized MPI, its world
//!   communicator is used and MPI is left alone. Otherwise railring initializes MPI itself and
//!   **finalizes it as soon as the bootstrap has succeeded** on this rank. Keeping the
//!   `Universe` alive until the communicator (or the process) ends was rejected on purpose:
//!   Open MPI treats any rank that exits after `MPI_Init` without `MPI_Finalize` as an
//!   "improper exit" (mpirun prints a page of error and returns 1 even when every rank exited
//!   with 0 — e.g. after `std::process::exit`, or when the communicator is still held by a
//!   worker thread at exit), and `MPI_Finalize` waits for every rank to finalize, so a
//!   finalize run on exit by a rank that failed would wait for ranks that are themselves
//!   waiting for it in a collective. Right after the bootstrap, every rank is present
//!   anyway, so finalizing costs nothing and every exit path is clean; failures still
//!   abort the whole job, because mpirun ends a job when one of its ranks exits non-zero.
//!   Programs that want MPI calls of their own next to railring call `mpi::initialize()`
//!   first (and keep the `Universe`), then `Communicator::init()` or `from_mpi`.
//!   If the bootstrap fails, MPI is deliberately *not* finalized: the rank then exits without
//!   `MPI_Finalize`, and mpirun ends the job instead of the other ranks waiting for it.

use super::offer::{self, StoreOffer};
use super::{launch, Rendezvous};
use crate::error::{Error, Result};
use crate::store;
use mpi::collective::Root;
use mpi::topology::Communicator as MpiCommunicator;
use std::time::Duration;

fn mpi_rank_size<C: MpiCommunicator>(world: &C) -> Result<(usize, usize)> {
    let (rank, size) = (world.rank(), world.size());
    if rank < 0 || size <= 0 || rank >= size {
        return Err(Error::Invalid(format!(
            "MPI communicator reports rank {rank} of {size}"
        )));
    }
    Ok((rank as usize, size as usize))
}

/// Broadcast rank 0's record (or its error) to every rank of `world`.
fn offer<C: MpiCommunicator>(
    world: &C,
    rank: usize,
) -> Result<(StoreOffer, Option<store::ServerHandle>)> {
    let root = world.process_at_rank(0);
    let (mut bytes, server) = if rank == 0 {
        let (rec, server) = offer::host();
        (rec.encode(), server)
    } else {
        (Vec::new(), None)
    };
    let mut len = bytes.len() as u64;
    root.broadcast_into(&mut len);
    if rank != 0 {
        // Our own rank 0 wrote at most a small record (+ an error text); refuse anything absurd
        // only after taking part in the broadcast would desynchronize: allocate up to 16 MiB.
        if len > 16 << 20 {
            return Err(Error::Invalid(format!(
                "MPI bootstrap: rank 0 announced a {len}-byte record (mismatched railring versions?)"
            )));
        }
        bytes = vec![0u8; len as usize];
    }
    root.broadcast_into(&mut bytes[..]);
    Ok((StoreOffer::decode(&bytes, "MPI")?, server))
}

/// The rendezvous over the ranks of an MPI communicator (usually `universe.world()`), in its
/// rank order. Collective over `world`: every rank of it must call this. MPI only carries the
/// store's address (see [the module docs](self)); the caller keeps MPI initialized for as long
/// as it uses MPI itself ([`crate::Communicator::from_mpi`] builds on this).
pub fn rendezvous_over<C: MpiCommunicator>(
    world: &C,
    connect_timeout: Duration,
) -> Result<Rendezvous> {
    launch::keep_program_marker();
    let (rank, size) = mpi_rank_size(world)?;
    let (rec, server) = offer(world, rank)?;
    offer::join(rank, size, rec, server, connect_timeout, "MPI")
}

/// `Communicator::init()`'s path for [`Launch::Mpi`](super::Launch::Mpi): the rendezvous over
/// `MPI_COMM_WORLD`, handed to `finish` (which builds the communicator), initializing MPI when
/// the program has not initialized it itself — and then finalizing it once `finish` succeeded
/// on this rank (see the module docs for why, and why not on failure).
pub(crate) fn init_world<R>(
    source: &'static str,
    connect_timeout: Duration,
    finish: impl FnOnce(Rendezvous) -> Result<R>,
) -> Result<R> {
    if mpi::environment::is_initialized() && mpi::environment::is_finalized() {
        return Err(Error::Invalid(
            "started by mpirun, but MPI was already finalized in this process: Communicator::init() \
             bootstraps from MPI once per process (it finalizes the MPI it initialized itself). \
             Keep the first communicator (split() makes sub-groups), or call mpi::initialize() \
             yourself, keep the Universe, and use Communicator::init() or Communicator::from_mpi()"
                .into(),
        ));
    }
    let universe = if mpi::environment::is_initialized() {
        None
    } else {
        Some(mpi::initialize().ok_or_else(|| {
            Error::Invalid("MPI_Init: MPI was initialized concurrently by another thread".into())
        })?)
    };
    let world = mpi::topology::SimpleCommunicator::world();
    tracing::info!(target: "railring::init", "started by an MPI launcher ({source} is set): bootstrapping over MPI_COMM_WORLD");
    let r = check_world_size(&world)
        .and_then(|()| rendezvous_over(&world, connect_timeout))
        .and_then(finish);
    match (r, universe) {
        (Ok(c), Some(u)) => {
            drop(u); // MPI_Finalize (waits for every rank: all of them just bootstrapped)
            Ok(c)
        }
        (Ok(c), None) => Ok(c),
        (Err(e), Some(u)) => {
            // No MPI_Finalize: exiting without it makes mpirun end the whole job, instead of
            // other ranks waiting for this one (see the module docs).
            std::mem::forget(u);
            Err(e)
        }
        (Err(e), None) => Err(e),
    }
}

/// A program linked against one MPI but started by another vendor's mpirun gets a world of
/// one on every rank ("singleton" init): say so instead of running N separate jobs.
fn check_world_size<C: MpiCommunicator>(world: &C) -> Result<()> {
    if let Some((v, n)) = launch::mpirun::world_size(&launch::process_env) {
        if world.size() as usize != n {
            return Err(Error::Env {
                var: v.into(),
                value: n.to_string(),
                why: format!(
                    "the launcher started {n} ranks but MPI_Init gives a world of {}: this program's MPI \
                     library ({}) does not match the mpirun that started it",
                    world.size(),
                    mpi::environment::library_version()
                        .map(|s| s.lines().next().unwrap_or("").trim().to_string())
                        .unwrap_or_else(|_| "?".into())
                ),
            });
        }
    }
    Ok(())
}
