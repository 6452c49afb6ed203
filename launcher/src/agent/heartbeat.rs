//! The agent's side of the heartbeat: every frame from railrun counts as a sign of life, and
//! railrun's pings carry the silence limit (`RAILRUN_HEARTBEAT`). An agent that hears nothing
//! for that long plus a margin (half of it, at least 2 s) — railrun's host unreachable, railrun
//! stopped or hung — kills its ranks by itself and exits, instead of waiting for a TCP
//! connection that may never report its end. The margin lets railrun, which can name the host
//! that went silent, speak first when the two are cut apart: if the agent killed its ranks
//! first, their peers elsewhere would fail and be reported as the job's first failure.

use crate::proto::{Liveness, Msg, DEFAULT_HEARTBEAT_TIMEOUT};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub(super) struct Heartbeat {
    live: Arc<Liveness>,
    limit_ms: AtomicU64,
}

impl Heartbeat {
    pub(super) fn new() -> Arc<Heartbeat> {
        Arc::new(Heartbeat {
            live: Liveness::new(),
            limit_ms: AtomicU64::new(with_margin(DEFAULT_HEARTBEAT_TIMEOUT.as_millis() as u64)),
        })
    }

    /// A frame from railrun arrived; true when it was a ping (nothing more to do with it).
    pub(super) fn heard(&self, msg: &Msg) -> bool {
        self.live.heard();
        match msg {
            Msg::Ping { timeout_ms } => {
                if *timeout_ms > 0 {
                    let limit = with_margin((*timeout_ms).clamp(1000, 3_600_000));
                    self.limit_ms.store(limit, Ordering::Relaxed);
                }
                true
            }
            _ => false,
        }
    }

    /// Why railrun counts as lost, when it was silent past the limit.
    pub(super) fn lost(&self) -> Option<String> {
        let limit = Duration::from_millis(self.limit_ms.load(Ordering::Relaxed));
        let silent = self.live.silent_for();
        (silent >= limit).then(|| {
            format!(
                "no word from railrun for {:.1} s (heartbeat limit {:.1} s, RAILRUN_HEARTBEAT): \
                 its host is unreachable or it is hung",
                silent.as_secs_f64(),
                limit.as_secs_f64()
            )
        })
    }
}

/// railrun's limit plus the agent's margin: half of it, at least 2 s.
fn with_margin(ms: u64) -> u64 {
    ms + (ms / 2).max(2000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_set_the_limit_and_silence_is_lost() {
        let h = Heartbeat::new();
        assert!(h.lost().is_none());
        assert!(h.heard(&Msg::Ping { timeout_ms: 1000 }));
        assert!(!h.heard(&Msg::Bye));
        assert!(h.lost().is_none());
        // railrun's limit 1 s, the agent's 1 + 2 s
        std::thread::sleep(Duration::from_millis(1500));
        assert!(h.lost().is_none(), "railrun speaks first");
        std::thread::sleep(Duration::from_millis(1600));
        let why = h.lost().expect("lost after 3 s of silence");
        assert!(why.contains("no word from railrun"), "{why}");
        h.heard(&Msg::Ping { timeout_ms: 0 });
        assert!(h.lost().is_none(), "a frame resets the silence");
    }
}
