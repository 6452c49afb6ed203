//! Static validation of one rank's plan before simulation: regions in bounds (scratch no
//! larger than the call's largest buffer), the input buffer read-only, in-node steps on the
//! work buffer, peers are other ranks, no overlapping send/receive without reduce, in-node
//! groups on one node with disjoint slices.

use super::error::CheckError;
use crate::plan::{Buf, Layout, Plan, Region, Step, Xfer};

pub(super) fn bad(rank: usize, step: usize, msg: impl Into<String>) -> CheckError {
    CheckError::BadStep {
        rank,
        step,
        msg: msg.into(),
    }
}

fn overlap(a: &Region, b: &Region) -> bool {
    a.buf == b.buf && a.len > 0 && b.len > 0 && a.offset < b.end() && b.offset < a.end()
}

pub(super) fn validate(
    p: &Plan,
    layout: &Layout,
    n: usize,
    work_len: usize,
    input_len: usize,
) -> Result<(), CheckError> {
    let r = p.rank;
    let scratch_len = work_len.max(input_len);
    let in_bounds = |step: usize, reg: &Region, writable: bool| -> Result<(), CheckError> {
        let (len, name) = match reg.buf {
            Buf::Work => (work_len, "work"),
            Buf::Input => (input_len, "input"),
            Buf::Scratch => (scratch_len, "scratch (at most the largest buffer)"),
        };
        if writable && reg.buf == Buf::Input && reg.len > 0 {
            return Err(bad(
                r,
                step,
                format!("writes {reg}: the input buffer is read-only"),
            ));
        }
        match reg.offset.checked_add(reg.len) {
            Some(end) if end <= len || reg.len == 0 => Ok(()),
            _ => Err(bad(
                r,
                step,
                format!("region {reg} is out of bounds ({name} buffer has {len} elements)"),
            )),
        }
    };
    let peer_ok = |step: usize, x: &Xfer| -> Result<(), CheckError> {
        if x.region.len == 0 {
            return Ok(());
        }
        if x.peer >= n {
            return Err(bad(
                r,
                step,
                format!("peer {} is not a rank (n = {n})", x.peer),
            ));
        }
        if x.peer == r {
            return Err(bad(r, step, "exchange with itself"));
        }
        Ok(())
    };
    for (i, s) in p.steps.iter().enumerate() {
        match s {
            Step::Exchange { send, recv, reduce } => {
                if let Some(x) = send {
                    peer_ok(i, x)?;
                    in_bounds(i, &x.region, false)?;
                }
                if let Some(x) = recv {
                    peer_ok(i, x)?;
                    in_bounds(i, &x.region, true)?;
                }
                if let (Some(s), Some(v), false) = (send, recv, reduce) {
                    if overlap(&s.region, &v.region) {
                        return Err(bad(
                            r,
                            i,
                            format!(
                                "send {} and receive {} overlap without reduce: an executor \
                                 receiving in place would corrupt the outgoing data",
                                s.region, v.region
                            ),
                        ));
                    }
                }
            }
            Step::Copy { src, dst } => {
                in_bounds(i, src, false)?;
                in_bounds(i, dst, true)?;
                if src.len != dst.len {
                    return Err(bad(r, i, format!("copy {src} -> {dst}: lengths differ")));
                }
            }
            Step::NodeReduceScatter { .. }
            | Step::NodeAllGather { .. }
            | Step::NodeBroadcast { .. }
            | Step::NodeAllToAll { .. } => {
                let group = s.node_group().unwrap_or(&[]);
                let slices = s.node_regions();
                if !group.contains(&r) {
                    return Err(bad(
                        r,
                        i,
                        format!("node group {group:?} does not contain it"),
                    ));
                }
                if let Step::NodeBroadcast { root, .. } = s {
                    if *root >= group.len() {
                        return Err(bad(
                            r,
                            i,
                            format!("broadcast root {root} is not a member of {group:?}"),
                        ));
                    }
                }
                if slices.len() != group.len() {
                    return Err(bad(
                        r,
                        i,
                        format!("{} slices for a group of {}", slices.len(), group.len()),
                    ));
                }
                let home = layout.locate(r).map(|x| x.0);
                for (j, &m) in group.iter().enumerate() {
                    if m >= n {
                        return Err(bad(r, i, format!("node group member {m} is not a rank")));
                    }
                    if group[..j].contains(&m) {
                        return Err(bad(r, i, format!("node group lists rank {m} twice")));
                    }
                    if layout.locate(m).map(|x| x.0) != home {
                        return Err(bad(
                            r,
                            i,
                            format!("node group {group:?}: rank {m} is on another node"),
                        ));
                    }
                }
                if let Some(x) = slices.iter().find(|x| x.buf != Buf::Work) {
                    return Err(bad(
                        r,
                        i,
                        format!("in-node step on {x}: only the work buffer is shared"),
                    ));
                }
                if let Step::NodeBroadcast { region, .. } = s {
                    in_bounds(i, region, true)?;
                    continue;
                }
                if let Step::NodeAllToAll {
                    blocks,
                    in_place: false,
                    ..
                } = s
                {
                    for b in blocks {
                        in_bounds(
                            i,
                            &Region {
                                buf: Buf::Input,
                                ..*b
                            },
                            false,
                        )?;
                    }
                }
                for (j, sl) in slices.iter().enumerate() {
                    in_bounds(i, sl, true)?;
                    if let Some(o) = slices[..j].iter().find(|o| overlap(o, sl)) {
                        return Err(bad(r, i, format!("node slices {o} and {sl} overlap")));
                    }
                }
            }
        }
    }
    Ok(())
}
