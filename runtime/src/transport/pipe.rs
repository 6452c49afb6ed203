//! A test pipe: an in-memory [`PipeLink`] between threads of one process, the transport for
//! unit tests of every algorithm through the real executor. Bounded, so partial sends and
//! back-pressure happen as they do on real links. (Not to be confused with [`super::MemKind`],
//! the kind of memory a transfer touches.)

use super::{Link, LinkError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

struct Pipe {
    q: Mutex<(VecDeque<u8>, bool)>,
    cap: usize,
}

pub struct PipeLink {
    tx: Arc<Pipe>,
    rx: Arc<Pipe>,
    name: String,
    sent: u64,
}

impl Drop for PipeLink {
    fn drop(&mut self) {
        // Mark our sending side closed so the peer sees us gone.
        self.tx.q.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
    }
}

/// A connected pair of links; each direction buffers at most `cap` bytes.
pub fn pair(a: usize, b: usize, cap: usize) -> (PipeLink, PipeLink) {
    let ab = Arc::new(Pipe {
        q: Mutex::new((VecDeque::new(), false)),
        cap: cap.max(1),
    });
    let ba = Arc::new(Pipe {
        q: Mutex::new((VecDeque::new(), false)),
        cap: cap.max(1),
    });
    (
        PipeLink {
            tx: ab.clone(),
            rx: ba.clone(),
            name: format!("pipe {a}->{b}"),
            sent: 0,
        },
        PipeLink {
            tx: ba,
            rx: ab,
            name: format!("pipe {b}->{a}"),
            sent: 0,
        },
    )
}

impl Link for PipeLink {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn try_send(&mut self, data: &[u8]) -> Result<usize, LinkError> {
        let mut q = self.tx.q.lock().unwrap_or_else(|e| e.into_inner());
        let n = data.len().min(self.tx.cap - q.0.len().min(self.tx.cap));
        q.0.extend(&data[..n]);
        self.sent += n as u64;
        Ok(n)
    }
    fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        let mut q = self.rx.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.0.is_empty() && q.1 {
            return Err(LinkError::PeerGone(
                "in-memory peer dropped its link".into(),
            ));
        }
        let n = buf.len().min(q.0.len());
        for (d, s) in buf.iter_mut().zip(q.0.drain(..n)) {
            *d = s;
        }
        Ok(n)
    }
    fn bytes_sent(&self) -> u64 {
        self.sent
    }
}
