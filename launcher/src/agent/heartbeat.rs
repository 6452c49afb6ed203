//! The agent's side of the heartbeat: every frame from railrun counts as a sign of life, and
//! railrun's pings carry the silence limit (`RAILRUN_HEARTBEAT`). An agent that hears nothing
//! for that long (railrun's host unreachable, railrun stopped or hung) kills its ranks by itself
//! and exits, instead of waiting for a TCP connection that may never report its end.

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
            limit_ms: AtomicU64::new(DEFAULT_HEARTBEAT_TIMEOUT.as_millis() as u64),
        })
    }

    /// A frame from railrun arrived; true when it was a ping (nothing more to do with it).
    pub(super) fn heard(&self, msg: &Msg) -> bool {
        self.live.heard();
        match msg {
            Msg::Ping { timeout_ms } => {
                if *timeout_ms > 0 {
                    self.limit_ms
                        .store((*timeout_ms).clamp(1000, 3_600_000), Ordering::Relaxed);
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
        std::thread::sleep(Duration::from_millis(1100));
        let why = h.lost().expect("lost after 1 s of silence");
        assert!(why.contains("no word from railrun"), "{why}");
        h.heard(&Msg::Ping { timeout_ms: 0 });
        assert!(h.lost().is_none(), "a frame resets the silence");
    }
}
