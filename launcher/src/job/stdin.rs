//! railrun's stdin goes to rank 0: straight into its pipe when rank 0 runs on this machine, as
//! `Stdin` frames to its node's agent otherwise (the agent feeds the pipe there).

use crate::proto::{FrameWriter, Msg};
use std::io::{Read, Write};
use std::process::ChildStdin;
use std::sync::Arc;

/// Where rank 0's stdin is.
pub(super) enum StdinTarget {
    Local(ChildStdin),
    Remote(Arc<FrameWriter<ChildStdin>>),
}

/// Copy railrun's stdin to `target` on a thread of its own until it ends (then close rank 0's
/// stdin: `StdinEof` for a remote rank 0). Not when railrun is a background job of a terminal,
/// where reading would stop it: a remote rank 0 gets `StdinEof` at once.
pub(super) fn forward(target: StdinTarget) {
    // SAFETY: plain syscalls on fd 0.
    let background = unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) != libc::getpgrp() };
    if background {
        if let StdinTarget::Remote(w) = &target {
            let _ = w.send(&Msg::StdinEof);
        }
        return;
    }
    let _ = std::thread::Builder::new()
        .name("rr-stdin".into())
        .spawn(move || {
            let mut input = std::io::stdin().lock();
            let mut buf = vec![0u8; 64 * 1024];
            match target {
                StdinTarget::Local(mut s) => loop {
                    match input.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                },
                StdinTarget::Remote(w) => loop {
                    match input.read(&mut buf) {
                        Ok(0) | Err(_) => {
                            let _ = w.send(&Msg::StdinEof);
                            return;
                        }
                        Ok(n) => {
                            if w.send(&Msg::Stdin {
                                data: buf[..n].to_vec(),
                            })
                            .is_err()
                            {
                                return;
                            }
                        }
                    }
                },
            }
        });
}
