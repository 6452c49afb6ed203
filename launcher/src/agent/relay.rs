//! The agent's store relay: serves its node's ranks on `127.0.0.1` and forwards every store
//! request to the launcher as a `StoreReq` frame over the agent's channel, answering each with
//! the launcher's `StoreResp`.

use super::Writer;
use crate::proto::Msg;
use railring::store::wire::{Request, Response};
use railring::store::Backend;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// The store relay: serves the node's ranks, forwarding each request to the launcher.
pub struct Relay {
    writer: Writer,
    pending: Mutex<HashMap<u64, mpsc::Sender<Vec<u8>>>>,
    next: AtomicU64,
    dead: AtomicBool,
}

thread_local! {
    static CONN_ID: Cell<u64> = const { Cell::new(0) };
}
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

impl Relay {
    pub(super) fn new(writer: Writer) -> Arc<Relay> {
        Arc::new(Relay {
            writer,
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            dead: AtomicBool::new(false),
        })
    }

    pub(super) fn deliver(&self, id: u64, frame: Vec<u8>) {
        let tx = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if let Some(tx) = tx {
            let _ = tx.send(frame);
        }
    }

    /// The launcher is gone: every waiting and future request fails.
    pub(super) fn fail_all(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

impl Backend for Relay {
    fn handle(&self, req: Request) -> Response {
        let lost =
            || Response::Error("the railrun agent lost its connection to the launcher".into());
        if self.dead.load(Ordering::SeqCst) {
            return lost();
        }
        // Each relay connection is served by its own thread: name it once.
        let conn = CONN_ID.with(|c| {
            if c.get() == 0 {
                c.set(NEXT_CONN.fetch_add(1, Ordering::Relaxed));
            }
            c.get()
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        if self.dead.load(Ordering::SeqCst) {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            return lost();
        }
        if let Err(e) = self.writer.send(&Msg::StoreReq {
            conn,
            id,
            frame: req.encode(),
        }) {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            return Response::Error(format!(
                "railrun agent: cannot forward the store request: {e}"
            ));
        }
        match rx.recv() {
            Ok(f) => Response::decode(&f).unwrap_or_else(|e| Response::Error(e.to_string())),
            Err(_) => lost(),
        }
    }
}
