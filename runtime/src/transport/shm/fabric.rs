//! The shared-memory in-node fabric ([`ShmFabric`], see [`super`]): chunked collectives
//! through the staging slots (the pipelined all-reduce among them), the one-round small
//! all-reduce, and the descriptor checks between the node's ranks.

use super::{Node, NHDR, NSLOT, SMALL_BOX, SMALL_HDR};
use crate::error::{Error, Result};
use crate::transport::{NodeMode, NodeOp, DESC};
use railring_collectives::kernels;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How much further than a line's reuse needs a rank a full ring of header lines ahead waits
/// for its slowest peer ([`ShmFabric::slot_free`]).
const SLOT_FREE_AHEAD: u64 = NHDR as u64 / 2;
/// Small calls hand their data's cache lines over ([`ShmFabric::hand_over`]) up to this many
/// bytes in the box.
const HAND_OVER_BOX: usize = 512;
/// Calls moving at least this many bytes write results with streaming stores.
const STREAM_MIN: usize = 8 << 20;

/// Copy `n` bytes of a result from `src` to `dst`: with streaming stores when `stream` (a
/// large out-of-place call: [`STREAM_MIN`]), else a plain copy.
///
/// # Safety
/// As [`kernels::copy_streaming`].
unsafe fn copy_result(dst: *mut u8, src: *const u8, n: usize, stream: bool) {
    if stream {
        kernels::copy_streaming(dst, src, n)
    } else {
        kernels::copy(dst, src, n)
    }
}

/// Bytes of a small all-reduce carried inside the header line.
const SMALL_INLINE: usize = SMALL_HDR - 16;
/// All-to-all calls whose blocks are at least this many bytes read peers' buffers directly when
/// the node agreed it can ([`Node::single_copy`]); below it a system call per block and a wait
/// per pair cost more than the second copy through a staging slot (4 ranks on 2 cores, railperf
/// with `RAILRING_SHM_SINGLE_COPY` on and off: 16 KiB blocks 24-38 µs in place against 14).
///
/// Where the node's ranks outnumber its CPUs the all-to-all stages unless the kernel copies
/// fast (as timed at set-up: see `SINGLE_COPY_ALLTOALL_MAX`) or every rank was told
/// `RAILRING_SHM_SINGLE_COPY=on` ([`Node::alltoall_single_min`]). On the VM these figures come
/// from (a slow kernel copy) a reader often
/// finds the partner whose buffer it needs descheduled, and the kernel's page-by-page copy is
/// slower than the slots, written once and read back from the last-level cache. railperf -z 1,
/// out of place / in place, single copy (`auto` before) against staged (`off` with
/// `RAILRING_ALGO=two_level`), 3 launches: 4 ranks on 2 cores, 200 calls, 64 KiB blocks 93-113 /
/// 137-145 µs against 37-46 / 32-37 (Open MPI 79-110 / 119-292), 256 KiB 223-328 / 306-1030
/// against 152-169 / 114-124; 60 calls, 1 MiB 1859-2199 / 1289-3423 against 1559-2250 /
/// 590-1498, 4 MiB 8829-10701 / 9268-11443 against 6897-9127 / 4792-5888. On 2 ranks (2 CPUs)
/// the single copy stays below `SINGLE_COPY_ALLTOALL_MAX`.
pub const SINGLE_COPY_ALLTOALL_MIN: usize = 32 << 10;
/// ...and blocks under this many bytes: larger ones stage on any node. The staged all-to-all
/// copies through slots that stay in the last-level cache, and since it does it beats the
/// kernel's page-by-page copy from 256 KiB blocks on 2 ranks (2 CPUs), out of place and in place
/// (where the single copy also pays a bounce buffer): railcompare -np 2 -- alltoall -b 32K -e 2M
/// -f 8 -n 200 -w 60 -z 1, 2 ABBA rounds, `RAILRING_SHM_SINGLE_COPY` off against auto, 1 MiB
/// blocks 104.8 / 61.1 µs against 140.1 / 166.7 (Open MPI 247.0 / 202.5 and 223.9 / 168.8 in
/// the same runs), 128 KiB blocks 19.8 / 21.5 against 13.7 / 20.1; railperf -n 200 (calls
/// started together), 3 launches each, 256 KiB blocks 26-32 / 21 against 38-45 / 57-70,
/// 512 KiB 46-54 / 37-47 against 70-75 / 98-104. (Before the slots stayed cached, 1 MiB blocks out of place took 252-299 µs staged
/// against 119-144 read directly, and the limit was 4 MiB.)
///
/// These upper limits (this one, [`SINGLE_COPY_PAIR_MAX`], [`SINGLE_COPY_BROADCAST_MAX`]) were
/// measured on a VM whose kernel copy between processes was slow. A two-rank node whose kernel
/// copy beats two memory copies (`kernel_copy_ratio`, agreed at set-up:
/// [`Node::large_single`]) has none: there, railperf -z 1 on 2 ranks, 2 MiB, out of place /
/// in place µs, staged against read directly: all-gather 204 / 146 against 170 / 62 (Open MPI
/// 164 / 67), all-to-all 230 / 110 against 172 / 157 (Open MPI 178 / 189), broadcast 244 / 150
/// against 209 / 58 (Open MPI 323 / 188).
///
/// On such a machine a node whose ranks outnumber its CPUs reads all-to-all blocks from
/// [`SINGLE_COPY_ALLTOALL_MIN`] to this limit directly too: 4 ranks on 2 CPUs, railperf -n 200
/// -w 60 -z 1, medians of 4 interleaved launches, out of place / in place µs, staged against
/// read directly (in place with the blocks staged for the peers, `ShmFabric::alltoall_stages`;
/// Open MPI): 128 KiB 28.4 / 26.5 against 25.3 / 27.0 (23.0 / 41.4), 512 KiB 152 / 97 against
/// 94 / 95 (127 / 128); 1 MiB (256 KiB blocks, -n 40) 270 / 187 against 312 / 229 (252 / 270).
/// (Measured again with the ranks bound to a core each before exec, the direct read won out of
/// place from 256 KiB blocks: see [`CROWDED_ALLTOALL_OOP_MAX`].)
pub const SINGLE_COPY_ALLTOALL_MAX: usize = 256 << 10;
/// On a node of more than two ranks that outnumber its CPUs and whose all-to-all reads
/// directly (its kernel copies fast, or it was told `on`), an all-to-all whose blocks run from
/// [`SINGLE_COPY_ALLTOALL_MAX`] to under this many bytes reads them directly too when every
/// local rank calls out of place (they agree first: `ShmFabric::all_out_of_place`). In place
/// it stages: the blocks do not fit the slot there, and reading through a bounce buffer was
/// slower than staging. 4 ranks on 2 CPUs, railperf alltoall -z 1 (-n 40 -w 5, from 12 MiB -n
/// 20 -w 3), medians of 4 interleaved launches, µs out of place / in place, staged against read
/// directly (Open MPI in the same loop): 1 MiB 277.6 / 182.2 against 233.6 / 193.4 (234.4 /
/// 258.6), 2 MiB 554.6 / 454.0 against 486.0 / 593.1 (535.1 / 601.5), 4 MiB 1102 / 907
/// against 980 / 1271 (963 / 1369), 8 MiB 2274 / 1809 against 1906 / 2660 (1895 / 2335), 12
/// MiB 3393 / 2662 against 2959 / 3644 (2801 / 3396); 16 MiB (4 MiB blocks) 4625 / 3545
/// against 4767 / 5239 (4457 / 4838). At 512 KiB (128 KiB blocks, already read directly) both
/// ways took 70-80 µs. 16 MiB out of place has gone both ways since, staged against read
/// directly (Open MPI): 4981 / 5025 (5435) when this limit was set, 5092 / 5473 (4983) on a
/// later VM, 5074 / 6238 (6420) in a slow spell of this one, and on it quiet (its kernel copy
/// 0.62-0.66x two memcpys at start-up), -n 20-30, medians of 4-6 interleaved launches: 16 MiB
/// 3765 / 2883 (2657), 20 MiB 4596 / 4184 (3954), 24 MiB 5712 / 5776 (5421), 28 MiB 6629 /
/// 7229 (6796), 32 MiB 7619 / 8563 (7862). Blocks up to just under 6 MiB read directly: where
/// staging won at 16 MiB it won by 1-23 %, where reading directly won, by 23 %, and staged the
/// cell sat at 0.77-0.80 of Open MPI where the kernel copy ran 0.62-0.66x (sb52, sb57).
pub const CROWDED_ALLTOALL_OOP_MAX: usize = 6 << 20;
/// All-gather and broadcast read the peer's block directly on two ranks, with blocks of at
/// least this many bytes and under [`SINGLE_COPY_PAIR_MAX`] (a broadcast's: under
/// [`SINGLE_COPY_BROADCAST_MAX`]; on more ranks see [`TREE_BROADCAST_MIN`]). Otherwise they
/// stage: the readers
/// all read the same blocks, which a slot serves from the last-level cache, where single-copy
/// readers each walk the owner's pages (`process_vm_readv`). Measured with railperf -z 1,
/// `RAILRING_SHM_SINGLE_COPY` auto against off, all-gather out of place / in place: 4 ranks 256
/// KiB 84-99 / 72-107 µs against 46-60 / 31-48, 16 MiB 7.4-8.3 / 6.5-7.5 ms against 4.4-4.5 /
/// 3.6-3.7; 3 ranks 192 KiB 67-75 / 62-79 µs against 36-56 / 27-49, 12 MiB 4.1-4.6 / 3.2-3.6 ms
/// against 2.6-2.8 / 2.3; 2 ranks 128 KiB 9-12 / 8-11 µs against 9-17 / 6-15, 512 KiB 31-37 /
/// 29-33 against 26-30 / 20-25, 2 MiB 136-147 / 113-118 against 104-105 / 70-72. Broadcast on 2
/// ranks (6 launches each, single copy against staged): 64 KiB 6.7-9.3 / 6.4-10.3 µs against
/// 9.3-10.9 / 7.6-11.2, 128 KiB 10.9-14.2 / 10.9-14.4 against 16.3-19.4 / 13.1-16.8, 256 KiB
/// 26-57 / 21-30 against 28-37 / 17-28; on 4 ranks at 4 MiB in place 1148 µs against 583.
pub const SINGLE_COPY_PAIR_MIN: usize = 64 << 10;
/// See [`SINGLE_COPY_PAIR_MIN`].
pub const SINGLE_COPY_PAIR_MAX: usize = 256 << 10;
/// A single-copy all-gather whose largest block has at least this many bytes writes this
/// rank's block into each peer's result (`process_vm_writev`) instead of reading the peer's
/// into its own (`process_vm_readv`): out of place the rank has just read its block for its own
/// copy, and the write reads it again from its own cache where the read walks the peer's. 2
/// ranks (the kernel copies fast here: every size direct), railperf allgather -z 1, medians of
/// 4-6 interleaved launches, µs out of place / in place, read against written (Open MPI in the
/// same loop): 64 KiB 3.02 / 2.65 against 3.35 / 2.65 (3.93 / 4.46), 128 KiB 4.71 / 3.95
/// against 5.18 / 3.76 (5.27 / 6.24), 512 KiB 15.5 / 10.4 against 15.4 / 10.0 (15.9 / 14.5),
/// 768 KiB 25.6 / 14.6 against 22.0 / 14.3 (26.1 / 21.3), 1 MiB 46.2 / 20.1 against 31.8 /
/// 19.0 (46.0 / 29.4), 2 MiB 154 / 58.8 against 115 / 53.4 (152 / 59.4), 4 MiB 376 / 204
/// against 349 / 186 (381 / 207), 8 MiB 784 / 410 against 774 / 432 (775 / 447), 16 MiB 1560
/// / 957 against 1509 / 889 (1545 / 972), 32 MiB 3512 / 1840 against 3263 / 1755 (3544 /
/// 1917).
const PUSH_ALL_GATHER_MIN: usize = 256 << 10;
/// A two-rank broadcast reads the root's block directly under this many bytes (from
/// [`SINGLE_COPY_PAIR_MIN`]; in place the root writes half of it, see
/// `ShmFabric::single_copy_broadcast`): one copy against staging's two, and staging fell into
/// spells 4-5x slower on this VM. railperf broadcast -n 400 -w 40 -z 1 (-n 200 from 512 KiB), 2
/// ranks, interleaved launches, out of place / in place µs medians (ranges): 256 KiB read
/// whole 21.2 / 20.4 (20-23 / 20-22) against 123.5 / 117.2 staged in a slow spell and 30.1 /
/// 22.5 (28-30 / 22-28) outside one (Open MPI 52.3 / 22.9); 512 KiB with the halves 39.8 / 20.1
/// (39-40 / 20-21) against 54.7 / 18.6 staged (one launch in 6: 247 / 214); 1 MiB 78.5 / 41.3
/// against 80.7 / 30.0 and 2 MiB 155 / 81 against 137 / 55, so from 1 MiB the block stages.
pub const SINGLE_COPY_BROADCAST_MAX: usize = 1 << 20;
/// On more than two local ranks a broadcast of this many bytes up to [`TREE_BROADCAST_MAX`]
/// goes down a binomial tree of direct reads (`ShmFabric::single_copy_broadcast`): three
/// kernel copies on 4 ranks where staging makes four memory copies (the root's into its slot
/// on the critical path), and no page of the root's read by every peer at once (all three
/// reading it took 45-49 µs in place at 256 KiB). railperf broadcast -n 200 -w 60 -z 1, 2 CPUs,
/// medians of 6 (3 ranks: 4) interleaved launches, µs out of place / in place, staged against
/// the tree (Open MPI in the same loop): 4 ranks 64 KiB 15.9 / 15.2 against 11.3 / 11.9 (22.2
/// / 12.8), 128 KiB 24.3 / 21.0 against 19.4 / 18.5 (38.9 / 25.3), 256 KiB 44.9 / 31.3
/// against 33.0 / 30.8 (72.9 / 53.7), 512 KiB 97.4 / 66.7 against 67.4 / 65.3 (148.8 /
/// 116.8), 1 MiB 240 / 138 against 197 / 201 (247 / 277), 2 MiB 471 / 317 against 517 / 558
/// (536 / 569); 3 ranks 64 KiB 16.6 / 13.2 against 10.4 / 10.6 (18.1 / 8.3), 256 KiB 46.6 /
/// 35.7 against 28.2 / 28.7 (46.6 / 20.9), 512 KiB 110.6 / 81.8 against 55.2 / 55.0 (94.1 /
/// 42.8), 1 MiB 273 / 187 against 200 / 144 (246 / 207).
/// From 1 MiB in place the staged root (a copy in its own cache) runs calls ahead of its
/// peers while the tree's root waits for its children every call.
/// On more than 4 ranks the tree's limit is [`TREE_BROADCAST_MAX_MANY`]: 6 and 8 ranks on 2
/// CPUs (4 launches each, same method), 256 KiB 85.0 / 66.0 against 64.5 / 54.9 and 114 / 94
/// against 95 / 73, but 512 KiB 174 / 129 against 161 / 145 and 224 / 174 against 268 / 261
/// (Open MPI 122 / 92, 261 / 212; 145 / 127, 334 / 304).
const TREE_BROADCAST_MIN: usize = 64 << 10;
/// See [`TREE_BROADCAST_MIN`] (inclusive; on up to 4 local ranks).
const TREE_BROADCAST_MAX: usize = 512 << 10;
/// See [`TREE_BROADCAST_MIN`] (inclusive; on more than 4 local ranks).
const TREE_BROADCAST_MAX_MANY: usize = 256 << 10;
/// On a node whose ranks outnumber its CPUs and whose kernel copies fast (as for
/// [`CROWDED_ALLTOALL_OOP_MAX`]), a broadcast of this many bytes up to
/// [`CROWDED_BROADCAST_OOP_MAX`] (exclusive) whose root calls out of place has every other
/// rank read the root's input directly (`process_vm_readv`) while the root copies its own
/// result; in place (the root's word, `ShmFabric::root_out_of_place`) it stages. Staged, the
/// root's CPU copies each chunk twice (into its slot, into its result) and a peer's copy-out
/// besides: 48 of the node's 80 MiB at 16 MiB on 2 CPUs. Read directly, the root copies 16
/// and each CPU's two readers about as much in kernel copies. 4 ranks on 2 CPUs, railperf
/// broadcast -z 1 -n 20 -w 3, medians of 4 interleaved launches, out of place µs, staged
/// against read directly (Open MPI in the same loop): 4 MiB 736 / 689 (893), 8 MiB 1585 /
/// 1278 (1430), 16 MiB 3222 / 2673 (2850; -n 40 -w 5, 6 launches: 3068 / 2415 (2710)), 32 MiB
/// 8412 / 8642 (9243), 64 MiB 20582 / 20576 (32615). In place staging stays far ahead (16
/// MiB: 2147 staged against 2617 read directly; Open MPI 2989).
const CROWDED_BROADCAST_OOP_MIN: usize = 4 << 20;
/// See [`CROWDED_BROADCAST_OOP_MIN`].
const CROWDED_BROADCAST_OOP_MAX: usize = 32 << 20;
/// A reduce on two ranks whose kernel copies fast ([`Node::large_single`]) of at least this
/// many bytes reads the peer's input directly ([`ShmFabric::single_copy_reduce`]; below it, the
/// one-round small reduce). railperf reduce -z 1, 2 ranks, µs out of place / in place, staged
/// (from 32 KiB: the one-round small reduce) against read directly (Open MPI 4.1): 32 KiB
/// 4.0 / 3.9 against 3.5 / 3.2 (3.0 / 3.6), 128 KiB 11.9 / 11.9 against 8.6 / 8.5 (8.0 /
/// 16.5), 512 KiB 57.2 / 47.8 against 28.6 / 29.0 (31.4 / 32.0), 2 MiB 318 / 271 against 206
/// / 151 (370 / 367), 8 MiB 1506 / 1142 against 1070 / 888 (1568 / 1570).
const SINGLE_COPY_REDUCE_MIN: usize = 32 << 10;
/// On two ranks whose kernel copies fast ([`Node::large_single`]) all-gather and all-to-all
/// blocks from this many bytes, and broadcasts from [`FAST_KERNEL_BROADCAST_MIN`], are read
/// directly too (not from [`SINGLE_COPY_PAIR_MIN`] / [`SINGLE_COPY_ALLTOALL_MIN`]). railperf
/// -n 1000 -z 1, 2 ranks, µs out of place / in place, staged against read directly (Open MPI):
/// all-gather 8 KiB (4 KiB blocks) 1.3 / 1.2 against 1.6 / 1.6 (2.4 / 2.6), 16 KiB 2.0 / 1.9
/// against 1.9 / 1.7 (2.4 / 2.8), 32 KiB 3.6 / 3.4 against 2.3 / 2.1 (2.9 / 3.2); all-to-all
/// 16 KiB 2.1 / 1.9 against 1.8 / 3.3 (2.5 / 3.8), 32 KiB 3.7 / 3.3 against 2.1 / 4.5 (2.9 /
/// 5.3) — in place the bounce buffer costs, still under Open MPI's; broadcast 8 KiB 1.0 / 1.0
/// against 1.3 / 1.5 (3.3 / 1.5), 16 KiB 1.8 / 1.7 against 1.6 / 1.6 (5.0 / 1.9), 32 KiB 3.8
/// / 3.2 against 2.3 / 1.8 (8.1 / 2.5).
const FAST_KERNEL_PAIR_MIN: usize = 8 << 10;
/// See [`FAST_KERNEL_PAIR_MIN`].
const FAST_KERNEL_BROADCAST_MIN: usize = 16 << 10;
/// A single-copy reduce of fewer bytes leaves the root 5/8 of the call to reduce, not half: the
/// other rank also writes its part into the root's result, one more system call. railperf
/// reduce -z 1, 2 ranks, 3 interleaved launches, medians out of place / in place µs, root's share
/// 1/2, 9/16, 5/8, 11/16 (Open MPI): 32 KiB 3.77 / 3.26, 3.42 / 3.02, 3.16 / 3.09, 2.74 / 3.06
/// (3.13 / 3.61); 128 KiB 9.05 / 8.60, 8.21 / 8.46, 7.23 / 7.47, 6.99 / 8.30 (8.36 / 18.05);
/// 512 KiB 30.0 / 29.4, 26.6 / 26.8, 23.7 / 25.2, 24.8 / 27.8 (34.6 / 36.0); 2 MiB 213 / 146,
/// 187 / 146, 211 / 143, 233 / 169 (397 / 411); 8 MiB (1/2, 5/8) 1046 / 861, 995 / 1048, and
/// 16 MiB 2367 / 1751, 2182 / 2218 (1556 / 1585, 3157 / 3340).
const SINGLE_COPY_REDUCE_EVEN: usize = 1 << 20;
/// From this many bytes a reduce on more than two local ranks (or two whose kernel copies
/// slowly), which runs as the pipelined all-reduce, has the other ranks write their reduced
/// pieces into the root's result (`process_vm_writev`, from a bounce buffer in their cache of
/// [`SINGLE_COPY_REDUCE_PIECE`] bytes) instead of into their slots for the root to copy out: the
/// root's copy-out was its CPU's last pass, alone, and the slot a pass more. railperf reduce -z
/// 1, 4 ranks on 2 CPUs, medians of 6 (4 from 4 MiB) interleaved launches, µs out of place / in
/// place, through slots against written (Open MPI): 64 KiB 16.7 / 17.3 against 18.6 / 19.9
/// (17.9 / 17.9), 128 KiB 28.5 / 29.5 against 28.8 / 31.5 (30.0 / 79.3), 256 KiB 61.1 / 63.6
/// against 52.7 / 57.6 (62.1 / 175.9), 1 MiB 326 / 287 against 284 / 286 (581 / 1150), 2 MiB
/// 654 / 639 against 551 / 562 (1250 / 2501), 8 MiB 2600 / 2515 against 2075 / 2080 (4681 /
/// 10390); 3 ranks, 2 MiB 617 / 615 against 552 / 514 (1159 / 1117), 8 MiB 2701 / 2549
/// against 2072 / 2053 (4551 / 4483).
const REDUCE_WRITE_MIN: usize = 256 << 10;
/// Bytes of the peer's input a single-copy reduce reads per system call, into a bounce buffer
/// that stays in the reducing rank's cache (256 KiB with the root reducing all of it: 16, 32,
/// 64, 128 KiB and whole measured 21.4, 19.3, 17.8, 16.3 and 16.5 µs out of place).
const SINGLE_COPY_REDUCE_PIECE: usize = 128 << 10;
/// An all-reduce on two ranks whose kernel copies fast ([`Node::large_single`]) of at least this
/// many bytes runs as the single-copy reduce with no root ([`ShmFabric::single_copy_reduce`]):
/// each rank reads its peer's half, reduces it into its result and writes it into its peer's —
/// where the one-round small all-reduce has every rank reduce the whole call, and the pipelined
/// one copies every byte into a slot and every reduced piece out of one. railperf all-reduce
/// -z 1, 2 ranks, medians of 6 (4 from 256 KiB) interleaved launches, µs out of place / in
/// place, one round (to 32 KiB) or pipelined against read directly (Open MPI 4.1): 8 KiB 2.5 /
/// 2.6 against 2.9 / 2.8, 10 KiB 3.1 / 3.2 against 3.1 / 2.6, 12 KiB 3.5 / 3.6 against 2.9 /
/// 2.8, 16 KiB 4.5 / 4.4 against 3.1 / 3.1 (9.0 / 9.5), 32 KiB 8.3 / 8.2 against 4.6 / 3.7
/// (12.1 / 13.7), 64 KiB 8.5 / 8.2 against 6.2 / 6.6 (18.6 / 21.5), 256 KiB 30.4 / 29.0
/// against 18.1 / 20.6 (46.9 / 46.6), 1 MiB 159 / 120 against 95 / 79 (214 / 178), 2 MiB 327 /
/// 298 against 233 / 178 (426 / 277), 16 MiB 2764 / 2240 against 1853 / 1581 (3390 / 2229),
/// 32 MiB 5319 / 4518 against 4452 / 3240 (12440 / 8725).
const SINGLE_COPY_ALLREDUCE_MIN: usize = 12 << 10;
/// Where a single-copy call publishes, in its header line, the address of its input, of its
/// result (a broadcast's, a reduce's or an all-reduce's), and how many bytes at the block's start a broadcast's root writes
/// into its peer's result ([`ShmFabric::single_copy_broadcast`]).
const LINE_INPUT: usize = 16;
const LINE_RESULT: usize = 24;
const LINE_SPLIT: usize = 32;
/// Broadcasts up to this many bytes go in one round through the root's slot: the root writes and
/// returns, every other rank copies from it.
const SMALL_BROADCAST: usize = 32 << 10;
/// All-gather blocks, and all-to-all and reduce-scatter inputs, of at most this many bytes go
/// in one round beside the header lines ([`ShmFabric::small_exchange`]).
const SMALL_EXCHANGE: usize = SMALL_BOX;
/// A reduce of at most this many bytes goes in one round: the others write and return, the
/// root reduces their copies with its own input, which it does not copy (on 4 local ranks or
/// more: [`SMALL_REDUCE_MANY`]). Copying it too, as the small all-reduce's ranks do, cost 4
/// ranks on 2 CPUs 5-10 % (railperf reduce -n 1000 -z 1, medians of 6 interleaved launches,
/// µs out of place, with the copy against without: 4 KiB 2.7 against 2.4, 8 KiB 8.4 / 7.9,
/// 16 KiB 13.2 / 12.5; Open MPI 11.4, 12.7, 15.8); 2 ranks measured the same either way.
const SMALL_REDUCE: usize = 32 << 10;
/// ...on 4 local ranks or more, up to this many: above it the root's reduction of every rank's
/// copy, alone, costs more than the pipelined reduce, whose ranks each reduce a piece.
/// railperf reduce -z 1 (-n 200–400), 2 CPUs, medians of 4–6 interleaved launches, µs out of
/// place / in place, one round against pipelined (Open MPI in the same loop): 4 ranks 16 KiB
/// 11.6 / 11.5 against 13.1 / 13.2 (16.8 / 16.8), 24 KiB 16.2 / 15.5 against 15.3 / 15.3,
/// 32 KiB 19.7 / 20.0 against 17.1 / 16.9 (24.3 / 23.4) and, in another series, 20.5 / 20.5
/// against 17.4 / 16.5 (20.8 / 20.6); 8 ranks 8 KiB 22.8 / 22.6 against 26.4 / 25.1, 16 KiB 29.5
/// / 29.3 against 29.1 / 30.8, 32 KiB 55.6 / 58.1 against 38.1 / 38.3 (37.5 / 36.1); but 3 ranks
/// 24 KiB 12.2 / 10.2 against 13.3 / 12.9 and 32 KiB 13.7 / 12.6 against 15.5 / 15.3 (13.9 /
/// 13.2).
const SMALL_REDUCE_MANY: usize = 16 << 10;
/// Yields before sleeping, on a node with more ranks than CPUs, while a staged (chunked)
/// broadcast waits: the waiters have nothing to do until the root's or the peers' chunk copies
/// finish, tens of microseconds, and a process that yields keeps its fair share of the CPU
/// (EEVDF and CFS pick it again: it has used little), taking turns from the root that shares its
/// CPU. railperf broadcast 2 MiB, 4 ranks on 2 CPUs, -n 200, 10 launches each, interleaved,
/// out of place / in place: 1000 yields (the oversubscribed default) 415-640 / 287-402 µs, with
/// 2 launches of 1704 / 1755 and 640 / 1935 (memcpy cycles 5x: the root switched out every few
/// microseconds), 10 yields 352-585 / 231-350 µs and no slow launch.
const OVERSUBSCRIBED_STAGED_BROADCAST_YIELDS: u32 = 10;
/// On a node with more ranks than CPUs, an out-of-place all-to-all that reads blocks of at
/// least this many bytes straight from the peers' inputs sleeps as soon as its brief spin is
/// over, without the yields in between: its waits (a partner still to start the call, partners
/// still reading this rank's input) last as long as a peer's block copy, and a rank that yields
/// through them keeps its fair share of the CPU it shares with a copying rank (set-up pins
/// such ranks one CPU each, round-robin), so the scheduler keeps handing it turns the copy
/// needs — as a staged broadcast's waiters did ([`OVERSUBSCRIBED_STAGED_BROADCAST_YIELDS`]).
/// A sleeping rank leaves that CPU to the copy. railperf alltoall -z 1 -n 40 -w 5, 4 ranks on
/// 2 CPUs, medians of 8-10 interleaved launches in three series, out of place µs, 1000 yields
/// (the oversubscribed default) against none (Open MPI in the same loop): 16 MiB 4034 / 3698
/// (3860), 4404 / 4281 (4024), 4124 / 3980 (3783); 8 MiB 1927 / 1793 (1807), 1846 / 1790
/// (1739), 1920 / 1877 (1734); 4 MiB (1 MiB blocks) 965 / 911 (993), 985 / 934 (1231), 921 /
/// 981 (960); 128 KiB 29 / 43 (32). Below 2 MiB blocks the waits are short enough that a
/// sleep's wake-up costs about what it frees (a host in a slow spell: the same code twice
/// differed by up to 13 %).
const CROWDED_ALLTOALL_SLEEP_MIN: usize = 2 << 20;

/// A 64-bit digest of a call descriptor: equal descriptors give equal digests; a difference is
/// then confirmed on the full descriptors.
fn desc_digest(desc: &[u8; DESC]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    for w in desc.chunks_exact(8) {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        h = (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
    h
}

/// Rank `r`'s partner in round `k` (0..m-1) of a round-robin tournament of `m` (even) players:
/// every pair meets exactly once; a partner >= the real number of ranks is a bye.
fn tournament_partner(r: usize, k: usize, m: usize) -> usize {
    let n = m - 1; // odd: 2 has an inverse mod n
    if r == n {
        (0..n).find(|&x| (2 * x) % n == k % n).unwrap_or(n)
    } else {
        let p = (k + n - r % n) % n;
        if p == r {
            n
        } else {
            p
        }
    }
}

/// The in-node collective engine over a [`Node`] segment.
pub struct ShmFabric {
    pub node: Arc<Node>,
    /// The cache-line hand-over hints this CPU has (small calls: [`Self::hand_over`]).
    hints: super::hint::Hints,
    /// The node's ranks outnumber its CPUs. Then the small all-reduce, all-gather, all-to-all
    /// and reduce-scatter do not hand their lines over (they took 2-5 % longer, 4 ranks on 2
    /// CPUs, 64-512 B, where the rooted calls gained: broadcast 64 B 0.29 -> 0.215 µs, reduce
    /// 64 B 0.48 -> 0.34), and a rank far ahead waits for its peers one line at a time
    /// ([`Self::slot_free`]: half a ring at once was as often slower as faster there).
    oversubscribed: bool,
    gen: u64,
    pub timeout: Duration,
    pub rank: usize,
    /// Spins, then yields, before sleeping on the bell; short when ranks outnumber CPUs.
    spin_limit: u32,
    /// The yields of the current call's waits ([`Self::wait_all`]): `yield_default`,
    /// `broadcast_yields` in a staged broadcast, none in a crowded node's large out-of-place
    /// all-to-all ([`CROWDED_ALLTOALL_SLEEP_MIN`]).
    yield_limit: u32,
    yield_default: u32,
    /// [`OVERSUBSCRIBED_STAGED_BROADCAST_YIELDS`] on an oversubscribed node, else `yield_default`.
    broadcast_yields: u32,
    /// The bounce buffer of an in-place single-copy all-to-all (kept between calls: one block,
    /// under [`SINGLE_COPY_ALLTOALL_MAX`]).
    scratch: Vec<u8>,
    /// The least `ready` generation seen on every local rank: a slot last used by a generation
    /// below it is free ([`Self::slot_free`]).
    seen: u64,
}

/// What to call a local index in errors.
fn who(node: &Node, i: usize) -> usize {
    node.ranks.get(i).copied().unwrap_or(i)
}

impl ShmFabric {
    pub fn new(node: Arc<Node>, timeout: Duration) -> ShmFabric {
        let rank = node.ranks[node.me];
        // the CPUs the machine's ranks share, not this rank's own (railrun may bind it to one)
        let cpus = crate::transport::kernel_cpus().unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        let oversubscribed = node.geo.local_size > cpus || crate::transport::oversubscribed();
        let (spin_limit, yield_limit) = if oversubscribed {
            (16, 1000)
        } else {
            (20_000, 200)
        };
        ShmFabric {
            node,
            gen: 0,
            timeout,
            rank,
            spin_limit,
            yield_limit,
            yield_default: yield_limit,
            broadcast_yields: if oversubscribed {
                OVERSUBSCRIBED_STAGED_BROADCAST_YIELDS
            } else {
                yield_limit
            },
            scratch: Vec::new(),
            hints: super::hint::Hints::detect(),
            oversubscribed,
            seen: 0,
        }
    }

    pub fn local_size(&self) -> usize {
        self.node.geo.local_size
    }

    /// Wait until `flag(j) >= target` for every local j, checking peers' liveness and the timeout.
    /// For flags every peer publishes with a sequentially consistent store (the chunked and
    /// single-copy paths'): a sleeper needs no fence of its own ([`Self::wait_flags`]).
    fn wait_all<'a>(
        &'a self,
        what: &str,
        target: u64,
        flag: impl Fn(usize) -> &'a AtomicU64,
    ) -> Result<()> {
        self.wait_flags(what, target, flag, false)
    }

    /// [`Self::wait_all`], where `released`: for flags a peer may publish with a release store
    /// ([`super::Node::publish_order`]: a small call's header line and `ready`), so a sleeper
    /// has the wakers fence first ([`super::Node::park`]).
    fn wait_flags<'a>(
        &'a self,
        what: &str,
        target: u64,
        flag: impl Fn(usize) -> &'a AtomicU64,
        released: bool,
    ) -> Result<()> {
        let l = self.local_size();
        let mut j = 0;
        // The fast path reads no clock (a clock read costs as much as the flag round of a small
        // all-reduce): the timers start once the spinning is over.
        while j < l && flag(j).load(Ordering::Acquire) >= target {
            j += 1;
        }
        let mut spins = 0u32;
        for _ in 0..self.spin_limit {
            if j == l {
                return Ok(());
            }
            std::hint::spin_loop();
            while j < l && flag(j).load(Ordering::Acquire) >= target {
                j += 1;
            }
            spins += 1;
        }
        let mut since = Instant::now();
        let mut checked = Instant::now();
        loop {
            while j < l && flag(j).load(Ordering::Acquire) >= target {
                j += 1;
                since = Instant::now();
            }
            if j == l {
                return Ok(());
            }
            // Spin briefly, yield a little, then sleep on the node's futex bell until a peer
            // stores a flag (ranks may outnumber cores: spinning would starve the peer we wait for).
            spins += 1;
            if spins < self.spin_limit {
                std::hint::spin_loop();
                continue;
            }
            if spins < self.spin_limit + self.yield_limit {
                std::thread::yield_now();
                continue;
            }
            self.node.park(
                || flag(j).load(Ordering::SeqCst) >= target,
                Duration::from_millis(20),
                released,
            );
            if checked.elapsed() < Duration::from_millis(50) {
                continue;
            }
            checked = Instant::now();
            if let Some(r) = self.node.aborted().filter(|&r| r != self.rank) {
                return Err(Error::PeerDead {
                    rank: self.rank,
                    peer: r,
                    host: self.node.host.clone(),
                    why: format!("it abandoned an in-node {what} after an error"),
                });
            }
            if !self.node.alive(j) {
                return Err(Error::PeerDead {
                    rank: self.rank,
                    peer: who(&self.node, j),
                    host: self.node.host.clone(),
                    why: format!("its process exited during an in-node {what}"),
                });
            }
            if since.elapsed() > self.timeout {
                let waiting = (0..l)
                    .filter(|&k| flag(k).load(Ordering::Acquire) < target)
                    .map(|k| who(&self.node, k))
                    .collect();
                return Err(Error::Timeout {
                    rank: self.rank,
                    secs: self.timeout.as_secs(),
                    waiting,
                    what: format!("in-node {what}"),
                });
            }
        }
    }

    /// Wait until local rank `j`'s `flag` reaches `target` (liveness and timeout checked as in
    /// [`Self::wait_all`], naming `j` alone).
    fn wait_peer(&self, what: &str, j: usize, target: u64, flag: &AtomicU64) -> Result<()> {
        self.wait_peer_flag(what, j, target, flag, false)
    }

    /// [`Self::wait_peer`], `released` as in [`Self::wait_flags`].
    fn wait_peer_flag(
        &self,
        what: &str,
        j: usize,
        target: u64,
        flag: &AtomicU64,
        released: bool,
    ) -> Result<()> {
        let done = AtomicU64::new(u64::MAX);
        self.wait_flags(
            what,
            target,
            |k| if k == j { flag } else { &done },
            released,
        )
    }

    /// Run one in-node collective (see [`crate::transport::NodeFabric::node_op`]), reading this rank's
    /// input from `call.src` when set (same offsets as `work`): an out-of-place call costs no
    /// extra pass over memory. All ranks pass identical slices; `desc` describes the call and
    /// peers' descriptors must match or the call fails naming both.
    ///
    /// # Safety
    /// `call.src` valid for reads and `call.work` for reads and writes over every slice.
    pub unsafe fn run(&mut self, call: NodeOp<'_>) -> Result<()> {
        let NodeOp {
            mode,
            dtype,
            op,
            src: _,
            work,
            slices,
            desc,
            describe,
        } = call;
        let src = call.input();
        self.yield_limit = self.yield_default;
        let l = self.local_size();
        let me = self.node.me;
        let esz = dtype.size();
        if l == 1 {
            if !std::ptr::eq(src, work) {
                for &(o, n) in slices {
                    std::ptr::copy(src.add(o), work.add(o), n);
                }
            }
            return Ok(());
        }
        // chunked data starts after the slot's first line (left unused)
        let slot = self.node.geo.slot_bytes - SMALL_HDR;
        let bytes = slices.iter().map(|s| s.1).sum::<usize>();
        let base = slices.first().map(|s| s.0).unwrap_or(0);
        let fits = bytes + SMALL_HDR <= slot;
        if mode == NodeMode::AllToAll && slices.windows(2).any(|w| w[0].1 != w[1].1) {
            return Err(Error::Plan(
                "in-node all-to-all with blocks of different lengths".into(),
            ));
        }
        let largest = slices.iter().map(|s| s.1).max().unwrap_or(0);
        // a reduce's blocks must lie end to end (single copy and the one-round small reduce)
        let contiguous = slices.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0);
        let single = match mode {
            NodeMode::Reduce { .. } | NodeMode::AllReduce | NodeMode::AllReduceSmall => {
                contiguous && self.single_copy_sizes(mode).contains(&bytes)
            }
            // (the size first: small calls skip reading the node's flags)
            NodeMode::AllToAll
                if largest >= SINGLE_COPY_ALLTOALL_MAX
                    && self.crowded_out_of_place_sizes().contains(&largest) =>
            {
                self.all_out_of_place(!std::ptr::eq(src, work))?
            }
            NodeMode::Broadcast { root }
                if largest >= CROWDED_BROADCAST_OOP_MIN
                    && self.crowded_broadcast_sizes().contains(&largest) =>
            {
                let direct = self.root_out_of_place(root, !std::ptr::eq(src, work))?;
                tracing::debug!(target: "railring::exec", rank = self.rank, "in-node broadcast of {largest} B from local rank {root}: {}", if direct { "the root calls out of place, every rank reads its input directly" } else { "the root calls in place, staged" });
                direct
            }
            _ => self.single_copy_sizes(mode).contains(&largest),
        };
        let small = fits
            && !single
            && match mode {
                NodeMode::AllReduceSmall => true,
                NodeMode::Reduce { .. } => {
                    let most = if self.local_size() >= 4 {
                        SMALL_REDUCE_MANY
                    } else {
                        SMALL_REDUCE
                    };
                    bytes <= most && contiguous
                }
                NodeMode::Broadcast { .. } => bytes <= SMALL_BROADCAST,
                NodeMode::AllGather => largest <= SMALL_EXCHANGE,
                NodeMode::AllToAll | NodeMode::ReduceScatter => {
                    bytes <= SMALL_EXCHANGE && contiguous
                }
                NodeMode::AllReduce => false,
            };
        // only header lines and boxes (no staging slot) for single-copy calls and small ones,
        // except an in-place single-copy all-to-all, which stages what its peers read
        let staged = if single {
            self.alltoall_stages(mode, src, work, largest)
        } else {
            None
        };
        self.slot_free(staged.is_some() || !(single || small && bytes <= SMALL_BOX))?;
        if small {
            let (src, work) = (src.add(base), work.add(base));
            match mode {
                NodeMode::Reduce { root } => {
                    return self.small_rooted(&call, src, work, bytes, root, true)
                }
                NodeMode::Broadcast { root } => {
                    return self.small_rooted(&call, src, work, bytes, root, false)
                }
                NodeMode::AllGather | NodeMode::AllToAll | NodeMode::ReduceScatter => {
                    return self.small_exchange(&call, base, bytes)
                }
                _ => return self.small_allreduce(&call, src, work, bytes),
            }
        }
        if single {
            return self.single_copy(&call, staged, largest);
        }
        // a large reduce runs as the all-reduce, with only the root getting the result (copied
        // out by the root, or from REDUCE_WRITE_MIN written into it by the others)
        let (mode, root) = match mode {
            NodeMode::AllReduceSmall => (NodeMode::AllReduce, None),
            NodeMode::Reduce { root } => (NodeMode::AllReduce, Some(root)),
            m => (m, None),
        };
        // Piece capacity per local rank inside one slot, a multiple of 64 bytes.
        let (piece_cap, max_slice) = match mode {
            NodeMode::Broadcast { .. } => {
                (slot & !63, slices.iter().map(|s| s.1).max().unwrap_or(0))
            }
            _ => (
                self.piece_cap(),
                slices.iter().map(|s| s.1).max().unwrap_or(0),
            ),
        };
        // The results of a large out-of-place call go to memory that is not cached (the output
        // buffer was not read): write them with streaming stores, saving the read of each
        // destination line before it is overwritten. In place, the lines were just read by the
        // copy-in and are cached; streaming measured slower there. A rank's own block (all-to-all,
        // all-gather) streams too: 4 ranks on 2 CPUs, all-to-all out of place, railperf -n 30 -z 1,
        // medians of 6 launches: 32 MiB 11786 -> 11060 µs, 16 MiB unchanged (4632 / 4638);
        // all-gather 32 MiB 6507 -> 6311 (4 launches).
        let total: usize = slices.iter().map(|s| s.1).sum();
        let stream = total >= STREAM_MIN && !std::ptr::eq(src, work);
        let copy_out = |d: *mut u8, s: *const u8, n: usize| copy_result(d, s, n, stream);
        let max_elems = max_slice / esz;
        let cap_elems = (piece_cap / esz).max(1);
        let nchunks = max_elems.div_ceil(cap_elems).max(1);
        if matches!(mode, NodeMode::Broadcast { .. }) {
            self.yield_limit = self.broadcast_yields;
        }
        if mode == NodeMode::AllReduce {
            return self.allreduce_chunks(&call, src, piece_cap, nchunks, stream, root);
        }
        // Out of place, the root of a broadcast stages each chunk after the first and writes
        // its own result in the same pass (`kernels::copy_twice`: the input read once): on a
        // node with more ranks than CPUs its CPU carries the staging, its own copy and a
        // neighbour's copy-out, the critical path. The first chunk is staged alone, so the
        // peers start copying sooner. railperf broadcast 2 MiB -n 200 -w 60 -z 1, 4 ranks on 2
        // CPUs, medians (ranges) of 8 launches out of place: 351 (336-469) µs; with the root
        // copying each staged chunk after publishing it, 381 (350-1059) and 388 (363-474) in
        // two such series. (Peers writing half of the root's output for it, process_vm_writev:
        // slower, 395-418 µs against 343-355.) Not from STREAM_MIN on: 16 MiB out of place
        // took 4527 / 4497 µs fused against 2825 / 3735 copied after publishing (2 / 4 ranks,
        // -n 20, medians of 3 / 2 launches).
        let fused = |c: usize| c > 0 && !std::ptr::eq(src, work) && !stream;
        for c in 0..nchunks {
            self.gen += 1;
            let g = self.gen;
            let s = (g % NSLOT as u64) as usize;
            // piece j of this chunk: (byte offset in work, bytes)
            let piece = |j: usize| -> (usize, usize) {
                let (off, len) = slices[j];
                let (po, pl) = railring_collectives::plan::split(len / esz, nchunks, c);
                (off + po * esz, pl * esz)
            };
            // No wait before reusing slot s (but a broadcast's root's, below): for the first
            // chunk slot_free saw its last user finished on every rank; each later chunk
            // follows a generation whose `ready` flags were all observed, and a rank publishes
            // `ready` for g-1 only after it finished g-2 entirely, so nobody still reads slot s.
            if c == 0 {
                self.publish_desc(g, desc, false);
            }
            // A staged broadcast goes one way: its root waits only until every peer is done
            // with the slot it is about to fill (a peer publishes `ready` for g only after it
            // finished g-1; slot s last held g - NSLOT), the others only for the root's chunk.
            // Every rank waiting for every other's `ready` made each call a barrier: 4 ranks on
            // 2 CPUs, railperf broadcast -z 1, 6 interleaved launches, µs out of place / in
            // place (Open MPI): 64 KiB 27.9 / 30.5 -> 14.9 / 14.1 (21.8 / 11.9), 256 KiB 49.8 /
            // 41.6 -> 45.1 / 33.6 (78.9 / 54.1), 1 MiB 243 / 188 -> 238 / 141 (231 / 216), 16
            // MiB (4 launches) 4036 / 2957 -> 3846 / 2525 (4953 / 3737).
            if let NodeMode::Broadcast { root } = mode {
                if me == root {
                    let free = (g + 1).saturating_sub(NSLOT as u64);
                    self.wait_all("broadcast (waiting for peers to free a slot)", free, |j| {
                        self.node.ready(j)
                    })?;
                }
            }
            let mine = self.node.chunk_area(me, s);
            match mode {
                NodeMode::AllGather => {
                    // (src may stand for a buffer holding only this rank's slice: see NodeOp)
                    let (o, n) = piece(me);
                    kernels::copy(mine.add(me * piece_cap), src.wrapping_add(o), n);
                }
                NodeMode::Broadcast { root } if me == root => {
                    let (o, n) = piece(0);
                    if fused(c) {
                        kernels::copy_twice(mine, work.add(o), src.add(o), n);
                    } else {
                        kernels::copy(mine, src.add(o), n);
                    }
                }
                NodeMode::Broadcast { .. } => {}
                _ => {
                    // our own piece is read straight from `src` by the reduction below
                    for j in (0..l).filter(|&j| j != me) {
                        let (o, n) = piece(j);
                        kernels::copy(mine.add(j * piece_cap), src.add(o), n);
                    }
                }
            }
            self.node.ready(me).store(g, Ordering::SeqCst);
            self.node.ring_bell();
            if let NodeMode::Broadcast { root } = mode {
                // out of place, the root's own result where it was not written with the
                // staging (the first chunk; every chunk from STREAM_MIN): the chunk it just
                // staged (cached), copied while the peers copy it out
                if me == root && !std::ptr::eq(src, work) && !fused(c) {
                    let (o, n) = piece(0);
                    kernels::copy(work.add(o), mine, n);
                }
            }
            if let NodeMode::Broadcast { root } = mode {
                if me == root {
                    continue;
                }
                self.wait_peer(
                    "broadcast (waiting for the root's data)",
                    root,
                    g,
                    self.node.ready(root),
                )?;
                if c == 0 {
                    self.check_desc_of(root, g, desc, describe)?;
                }
            } else {
                self.wait_all("collective (waiting for peers' data)", g, |j| {
                    self.node.ready(j)
                })?;
                if c == 0 {
                    self.check_descs(g, desc, describe)?;
                }
            }
            match mode {
                NodeMode::ReduceScatter => {
                    let (o, n) = piece(me);
                    let srcs = self.piece_sources(s, piece_cap, src.add(o));
                    kernels::reduce_many_raw(dtype, op, work.add(o), &srcs, n);
                }
                NodeMode::AllGather => {
                    for j in (0..l).filter(|&j| j != me) {
                        let (o, n) = piece(j);
                        copy_out(
                            work.add(o),
                            self.node.chunk_area(j, s).add(j * piece_cap),
                            n,
                        );
                    }
                    if !std::ptr::eq(src, work) {
                        let (o, n) = piece(me);
                        copy_out(work.add(o), src.wrapping_add(o), n);
                    }
                }
                NodeMode::Broadcast { root } => {
                    if me != root {
                        let (o, n) = piece(0);
                        kernels::copy(work.add(o), self.node.chunk_area(root, s), n);
                    }
                }
                NodeMode::AllToAll => {
                    // peer j left the piece destined for us in its slot at our index
                    for j in (0..l).filter(|&j| j != me) {
                        let (o, n) = piece(j);
                        copy_out(
                            work.add(o),
                            self.node.chunk_area(j, s).add(me * piece_cap),
                            n,
                        );
                    }
                    let (o, n) = piece(me);
                    if !std::ptr::eq(src, work) {
                        copy_out(work.add(o), src.add(o), n);
                    }
                }
                NodeMode::AllReduce | NodeMode::AllReduceSmall | NodeMode::Reduce { .. } => {
                    unreachable!("handled above")
                }
            }
        }
        Ok(())
    }

    /// All-to-all, all-gather or broadcast in one generation, each block copied once: every rank
    /// publishes where its input is (in its slot's header line, beside the generation), then
    /// reads what it needs straight from the peers' buffers (`process_vm_readv`). The node
    /// agreed beforehand that every rank can read every other ([`Node::single_copy`]), and the
    /// choice depends only on the call's shape, so all local ranks take this path together.
    /// All-gather: each rank then says it is done and returns once every peer is, since they
    /// read its buffer (from [`PUSH_ALL_GATHER_MIN`] by `largest`, the call's largest block, it
    /// writes its block into theirs instead). All-to-all goes pairwise ([`Self::pairwise_all_to_all`]), which also
    /// works in place (`staged`: [`Self::alltoall_stages`] of the call); broadcast:
    /// [`Self::single_copy_broadcast`].
    unsafe fn single_copy(
        &mut self,
        call: &NodeOp<'_>,
        staged: Option<usize>,
        largest: usize,
    ) -> Result<()> {
        let &NodeOp {
            mode,
            work,
            slices,
            desc,
            describe,
            ..
        } = call;
        let input = call.input();
        let l = self.local_size();
        let me = self.node.me;
        self.gen += 1;
        let g = self.gen;
        // (the line is free: see slot_free)
        let addr = |j: usize| -> &AtomicU64 {
            &*(self.node.line(j, g).add(LINE_INPUT) as *const AtomicU64)
        };
        addr(me).store(input as u64, Ordering::Relaxed);
        // a broadcast and a reduce also publish where their result goes (a peer writes part of
        // it: [`Self::single_copy_broadcast`], [`Self::single_copy_reduce`]), and a broadcast's
        // root how much of the peer's it writes
        let line = self.node.line(me, g);
        let push = mode == NodeMode::AllGather && largest >= PUSH_ALL_GATHER_MIN;
        if push
            || matches!(
                mode,
                NodeMode::Broadcast { .. }
                    | NodeMode::Reduce { .. }
                    | NodeMode::AllReduce
                    | NodeMode::AllReduceSmall
            )
        {
            (*(line.add(LINE_RESULT) as *const AtomicU64)).store(work as u64, Ordering::Relaxed);
        }
        if let NodeMode::Broadcast { root } = mode {
            let split = if me == root && l == 2 && std::ptr::eq(input, work) {
                (slices[0].1 / 2) & !63
            } else {
                0
            };
            (*(line.add(LINE_SPLIT) as *const AtomicU64)).store(split as u64, Ordering::Relaxed);
        }
        // an in-place all-to-all copies the blocks its peers read into its slot (`staged`: it
        // overwrites its buffer as it reads theirs) and says so where a broadcast says its split
        if mode == NodeMode::AllToAll {
            if let Some(piece_cap) = staged {
                let mine = self.node.chunk_area(me, (g % NSLOT as u64) as usize);
                for (j, &(o, n)) in slices.iter().enumerate().filter(|&(j, _)| j != me) {
                    kernels::copy(mine.add(j * piece_cap), input.add(o), n);
                }
            }
            (*(line.add(LINE_SPLIT) as *const AtomicU64))
                .store(u64::from(staged.is_some()), Ordering::Relaxed);
        }
        self.publish_desc(g, desc, false);
        self.node.ready(me).store(g, Ordering::SeqCst);
        self.node.ring_bell();
        if let NodeMode::Broadcast { root } = mode {
            return self.single_copy_broadcast(g, root, input, work, slices[0], desc, describe);
        }
        if let NodeMode::Reduce { root } = mode {
            return self.single_copy_reduce(g, Some(root), call, input, work);
        }
        if matches!(mode, NodeMode::AllReduce | NodeMode::AllReduceSmall) {
            return self.single_copy_reduce(g, None, call, input, work);
        }
        // Out of place, this rank's own block is copied while the peers publish theirs: peers
        // read the input, never `work`, so the copy needs no one. In a call of STREAM_MIN bytes
        // or more it streams, as the staged path's own block does (the result lines were not
        // read, so no read of each before it is overwritten): railperf -n 40 -w 5 -z 1, medians
        // of 6-8 interleaved launches, out of place µs, plain against streaming copy (Open MPI
        // in the same loop): all-to-all 4 ranks on 2 CPUs 16 MiB 3609 / 3210 (3461) and 3287 /
        // 3136 (3135), 8 MiB 1779 / 1749 (1722); 2 ranks 16 MiB 1476 / 1380 (1467), 8 MiB 709
        // / 667 (763); all-gather 2 ranks 16 MiB 1312 / 1241 (1417), 8 MiB 652 / 625 (687).
        if !std::ptr::eq(input, work) {
            let (o, n) = slices[me];
            let total: usize = slices.iter().map(|s| s.1).sum();
            copy_result(work.add(o), input.wrapping_add(o), n, total >= STREAM_MIN);
        }
        if mode == NodeMode::AllToAll {
            return self.pairwise_all_to_all(g, call, staged);
        }
        self.wait_all("collective (waiting for peers' buffers)", g, |j| {
            self.node.ready(j)
        })?;
        self.check_descs(g, desc, describe)?;
        // all-gather: each rank starts with its next neighbour, so no buffer is read by every
        // rank at once; large blocks are written into the peers' results instead (every rank
        // decides alike: by the largest block)
        for j in (1..l).map(|k| (me + k) % l) {
            if push {
                let (o, n) = slices[me];
                let mine = input.wrapping_add(o) as *mut u8;
                self.peer_copy(j, g, LINE_RESULT, mine, o, n, true)?;
            } else {
                let (o, n) = slices[j];
                self.read_peer(j, g, work.add(o), o, n)?;
            }
        }
        self.node.reduced(me).store(g, Ordering::SeqCst);
        self.node.ring_bell();
        self.wait_all(
            "all-gather (waiting for peers to read this rank's block)",
            g,
            |j| self.node.reduced(j),
        )?;
        Ok(())
    }

    /// The single-copy broadcast of generation `g` (this rank's input and result addresses
    /// are published): every other rank reads the root's block `(o, n)` straight into its
    /// `work` and says so; the root copies its own block out of place meanwhile and returns
    /// once every peer read it. In place on two ranks the root has nothing of its own to copy,
    /// so it writes the first half of the block into its peer's result (`process_vm_writev`)
    /// while the peer reads the second, and the peer returns once the root says it wrote:
    /// both CPUs copy. railperf broadcast -b 64K -e 256K -f 2 -n 400 -w 40 -z 1, 2 ranks,
    /// interleaved launches, in place µs medians (ranges), the root's block read whole against
    /// in halves: 64 KiB 6.9 (6-8) against 4.8 (4-5), 128 KiB 11.5 (11-13) against 6.7 (6-8),
    /// 256 KiB 20.8 (20-22) against 11.7 (11-13). On more ranks the block goes down a binomial
    /// tree of such reads ([`TREE_BROADCAST_MIN`]), or, on a crowded node whose root calls out
    /// of place, every rank reads the root's input ([`CROWDED_BROADCAST_OOP_MIN`]).
    #[allow(clippy::too_many_arguments)]
    unsafe fn single_copy_broadcast(
        &mut self,
        g: u64,
        root: usize,
        input: *const u8,
        work: *mut u8,
        (o, n): (usize, usize),
        desc: &[u8; DESC],
        describe: &dyn Fn(&[u8; DESC]) -> String,
    ) -> Result<()> {
        let me = self.node.me;
        let l = self.local_size();
        if l > 2 {
            // A binomial tree over the ranks numbered from the root (v): v > 0 reads the
            // block from its parent (v less its highest bit; the root's input, another
            // parent's result once its `reduced` says it has the block), says so, and every
            // rank returns once its children (v + 2^k for 2^k > v) read from it.
            let v = (me + l - root) % l;
            let real = |v: usize| (v + root) % l;
            // a crowded node's large broadcast with its root out of place: every rank reads the
            // root's input (a parent's whole result was a round behind; [`CROWDED_BROADCAST_OOP_MIN`])
            let flat = n >= CROWDED_BROADCAST_OOP_MIN;
            if v > 0 {
                let pv = if flat {
                    0
                } else {
                    v & !(1usize << (usize::BITS - 1 - v.leading_zeros()))
                };
                let p = real(pv);
                self.wait_buffer(
                    "broadcast (waiting for the parent's buffer)",
                    p,
                    g,
                    desc,
                    describe,
                )?;
                let at = if pv == 0 {
                    LINE_INPUT
                } else {
                    self.wait_peer(
                        "broadcast (waiting for the parent's copy)",
                        p,
                        g,
                        self.node.reduced(p),
                    )?;
                    LINE_RESULT
                };
                self.peer_copy(p, g, at, work.add(o), o, n, false)?;
                self.node.reduced(me).store(g, Ordering::SeqCst);
                self.node.ring_bell();
            } else if !std::ptr::eq(input, work) {
                // (the root's children read its input: nobody waits for its `reduced`)
                copy_result(work.add(o), input.add(o), n, n >= STREAM_MIN);
            }
            let mut step = match (v, flat) {
                (0, _) => 1,
                (_, true) => l,
                _ => 1usize << (usize::BITS - v.leading_zeros()),
            };
            while v + step < l {
                let c = real(v + step);
                self.wait_peer(
                    "broadcast (waiting for peers to read this rank's copy)",
                    c,
                    g,
                    self.node.reduced(c),
                )?;
                step = if flat { step + 1 } else { step << 1 };
            }
            return Ok(());
        }
        // the bytes at the block's start the root writes to its peer (published in its line)
        let split = |j: usize| -> usize {
            (*(self.node.line(j, g).add(LINE_SPLIT) as *const AtomicU64)).load(Ordering::Relaxed)
                as usize
        };
        if me == root {
            if !std::ptr::eq(input, work) {
                kernels::copy(work.add(o), input.add(o), n);
            }
            let h = split(me);
            if h > 0 {
                let peer = 1 - me;
                self.wait_buffer(
                    "broadcast (waiting for the peer's buffer)",
                    peer,
                    g,
                    desc,
                    describe,
                )?;
                self.peer_copy(peer, g, LINE_RESULT, work.add(o), o, h, true)?;
                self.node.reduced(me).store(g, Ordering::SeqCst);
                self.node.ring_bell();
            } else {
                self.node.reduced(me).store(g, Ordering::Relaxed);
            }
            self.wait_all(
                "broadcast (waiting for peers to read the root's block)",
                g,
                |j| self.node.reduced(j),
            )?;
            return Ok(());
        }
        self.wait_buffer(
            "broadcast (waiting for the root's buffer)",
            root,
            g,
            desc,
            describe,
        )?;
        let h = split(root).min(n);
        self.peer_copy(root, g, LINE_INPUT, work.add(o + h), o + h, n - h, false)?;
        self.node.reduced(me).store(g, Ordering::SeqCst);
        self.node.ring_bell();
        if h > 0 {
            self.wait_peer(
                "broadcast (waiting for the root to write its half)",
                root,
                g,
                self.node.reduced(root),
            )?;
        }
        Ok(())
    }

    /// Copy `n` bytes at offset `off` of local rank `j`'s buffer to `local` (`write` false),
    /// or from `local` to there: the buffer whose address `j` published at byte `at` of its
    /// header line of generation `g` ([`LINE_INPUT`] or [`LINE_RESULT`]). Names the peer on
    /// failure.
    #[allow(clippy::too_many_arguments)]
    unsafe fn peer_copy(
        &self,
        j: usize,
        g: u64,
        at: usize,
        local: *mut u8,
        off: usize,
        n: usize,
        write: bool,
    ) -> Result<()> {
        let addr = &*(self.node.line(j, g).add(at) as *const AtomicU64);
        let remote = (addr.load(Ordering::Relaxed) as usize).wrapping_add(off);
        let done = if write {
            self.node.peer_write(j, local, remote, n)
        } else {
            self.node.peer_read(j, local, remote, n)
        };
        done.map_err(|e| {
            if e.raw_os_error() == Some(libc::ESRCH) {
                Error::PeerDead {
                    rank: self.rank,
                    peer: who(&self.node, j),
                    host: self.node.host.clone(),
                    why: "its process exited during an in-node collective".into(),
                }
            } else {
                let (verb, call) = if write {
                    ("writing", "process_vm_writev")
                } else {
                    ("reading", "process_vm_readv")
                };
                Error::Plan(format!(
                    "rank {}: {verb} {n} bytes of local rank {}'s buffer ({call}): \
                     {e}; RAILRING_SHM_SINGLE_COPY=off avoids it",
                    self.rank,
                    who(&self.node, j)
                ))
            }
        })
    }

    /// [`Self::peer_copy`] from local rank `j`'s input.
    unsafe fn read_peer(&self, j: usize, g: u64, dst: *mut u8, off: usize, n: usize) -> Result<()> {
        self.peer_copy(j, g, LINE_INPUT, dst, off, n, false)
    }

    /// The single-copy reduce of generation `g` on two ranks (inputs' and results' addresses
    /// published): each rank reads part of its peer's input (the root 5/8 of a call under
    /// [`SINGLE_COPY_REDUCE_EVEN`], else half) a piece at a time into a bounce
    /// buffer that stays in its cache (`process_vm_readv`) and reduces it with the same part of
    /// its own input — the root into its result, the other rank in the bounce, which it then
    /// writes into the root's result (`process_vm_writev`). Both say when they are done with
    /// the other's buffers, and each returns once the other is. Both CPUs reduce, and each
    /// byte is copied once by the kernel (plus the write-back of the other rank's part), where
    /// the staged reduce copies every half into a slot and the root's half back out, and Open
    /// MPI's root reads and reduces the whole block alone (see [`SINGLE_COPY_REDUCE_MIN`]).
    ///
    /// With no root it is the all-reduce (see [`SINGLE_COPY_ALLREDUCE_MIN`]): each rank
    /// reduces its own slice so, into its result, and writes it into its peer's. In place a
    /// rank's slice of its peer's buffer is read only by this rank, piece by piece, before this
    /// rank writes that piece's result there.
    unsafe fn single_copy_reduce(
        &mut self,
        g: u64,
        root: Option<usize>,
        call: &NodeOp<'_>,
        input: *const u8,
        work: *mut u8,
    ) -> Result<()> {
        let &NodeOp {
            dtype,
            op,
            slices,
            desc,
            describe,
            ..
        } = call;
        let me = self.node.me;
        if root.is_some_and(|r| r >= 2) || root.is_none() && slices.len() != 2 {
            return Err(Error::Plan(format!(
                "in-node single-copy reduction on 2 local ranks with root {root:?} and {} slices",
                slices.len()
            )));
        }
        let peer = 1 - me;
        let base = slices.first().map_or(0, |s| s.0);
        let bytes: usize = slices.iter().map(|s| s.1).sum();
        let esz = dtype.size();
        // this rank's part, [from, to) past `base`: a reduce's root reduces the first `split`
        // bytes, its peer the rest (which it also writes back: the root takes more of a call
        // under SINGLE_COPY_REDUCE_EVEN); an all-reduce's ranks their own slices
        let (from, to) = match root {
            Some(root) => {
                let eighths = if bytes < SINGLE_COPY_REDUCE_EVEN {
                    5
                } else {
                    4
                };
                let split = (bytes / 8 * eighths) / esz * esz;
                if me == root {
                    (0, split)
                } else {
                    (split, bytes)
                }
            }
            None => {
                let (o, n) = slices[me];
                (o - base, o - base + n)
            }
        };
        // whether this rank keeps its part's result, and whether it writes it into its peer's
        let keeps = root.is_none_or(|r| r == me);
        let writes = root.is_none_or(|r| r != me);
        let (waiting, finishing) = match root {
            Some(r) if r != me => (
                "reduce (waiting for the root)",
                "reduce (waiting for the root to finish with this rank's buffers)",
            ),
            Some(_) => (
                "reduce (waiting for the peer)",
                "reduce (waiting for the peer to finish with this rank's buffers)",
            ),
            None => (
                "all-reduce (waiting for the peer)",
                "all-reduce (waiting for the peer to finish with this rank's buffers)",
            ),
        };
        self.wait_buffer(waiting, peer, g, desc, describe)?;
        let piece = SINGLE_COPY_REDUCE_PIECE - SINGLE_COPY_REDUCE_PIECE % esz;
        // the bounce is written by the kernel before it is read (as the all-to-all's)
        let mut bounce = std::mem::take(&mut self.scratch);
        bounce.clear();
        bounce.reserve(piece.min(to - from));
        // reduced into the result where it is: unless this rank's input comes second there and
        // is its result (in place), which the reduction would combine through its accumulator
        let into_result = keeps && (me < peer || !std::ptr::eq(input, work));
        let mut off = from;
        let mut result = Ok(());
        while off < to && result.is_ok() {
            let k = piece.min(to - off);
            let b = bounce.as_mut_ptr();
            result = self.read_peer(peer, g, b, base + off, k);
            if result.is_err() {
                break;
            }
            let mine = input.add(base + off);
            let dst = work.add(base + off);
            // local rank order, as every other path combines
            let srcs = if me < peer {
                [mine, b]
            } else {
                [b as *const u8, mine]
            };
            // the piece's result: in this rank's result, or in the bounce
            let done = if into_result {
                kernels::reduce_many_raw(dtype, op, dst, &srcs, k);
                dst
            } else {
                kernels::reduce_many_raw(dtype, op, b, &srcs, k);
                if keeps {
                    kernels::copy(dst, b, k);
                }
                b
            };
            if writes {
                result = self.peer_copy(peer, g, LINE_RESULT, done, base + off, k, true);
            }
            off += k;
        }
        self.scratch = bounce;
        result?;
        // `reduced`: this rank has read its peer's input (and written its part, if it does)
        self.node.reduced(me).store(g, Ordering::SeqCst);
        self.node.ring_bell();
        self.wait_peer(finishing, peer, g, self.node.reduced(peer))
    }

    /// The single-copy all-to-all of generation `g` (this rank's input address is published)
    /// into `work`: pairwise rounds of a round-robin tournament, so a rank waits for one
    /// partner at a time — for its published buffer (and matching descriptor), then for its
    /// read — never for all local ranks at once: that barrier cost 4 ranks on 2 cores 10-20 %
    /// at 256 KiB in short runs (railperf -n 40 -z 1, 8 launches, median µs out of place / in
    /// place: 135 / 275 with it, 124 / 236 without; at -n 200 no clear difference). In the
    /// round where two ranks meet, each reads the other's block for it and says so, from the
    /// partner's input or, where the partner staged its blocks (`staged`, an in-place call:
    /// [`Self::alltoall_stages`]), from its slot ([`Self::read_block`]). Out of place, or in
    /// place with its own blocks staged, a rank reads straight into `work`; in place with
    /// blocks too large for its slot it reads into a bounce buffer and, once the partner says it
    /// has read the block this rank is about to overwrite, copies the bounce there. Both sides
    /// read at once, and the protocol is the same whichever way either side calls, so ranks
    /// calling in place and out of place meet. A rank whose input is read directly returns only
    /// after every partner read it.
    unsafe fn pairwise_all_to_all(
        &mut self,
        g: u64,
        call: &NodeOp<'_>,
        staged: Option<usize>,
    ) -> Result<()> {
        let &NodeOp {
            work,
            slices,
            desc,
            describe,
            ..
        } = call;
        let in_place = std::ptr::eq(call.input(), work);
        let l = self.local_size();
        let me = self.node.me;
        let n = slices[me].1;
        // in place with the blocks staged, this rank reads straight into its buffer
        let bounced = in_place && staged.is_none();
        // the bounce is written by the kernel before it is read: its capacity is enough (no
        // pass zeroing it)
        let mut bounce = std::mem::take(&mut self.scratch);
        bounce.clear();
        if bounced {
            bounce.reserve(n);
        }
        if self.oversubscribed && !in_place && n >= CROWDED_ALLTOALL_SLEEP_MIN {
            self.yield_limit = 0;
        }
        let m = l + (l % 2); // a bye for odd sizes
        let base = g << 24;
        let mut result = Ok(());
        for k in 0..m - 1 {
            let p = tournament_partner(me, k, m);
            let signal = |node: &super::Node| {
                node.pairs(me).store(base + k as u64 + 1, Ordering::SeqCst);
                node.ring_bell();
            };
            if p >= l {
                signal(&self.node);
                continue;
            }
            let dst = if bounced {
                bounce.as_mut_ptr()
            } else {
                work.add(slices[p].0)
            };
            result = self
                .wait_buffer(
                    "all-to-all (waiting for a partner's buffer)",
                    p,
                    g,
                    desc,
                    describe,
                )
                .and_then(|_| self.read_block(p, g, dst, slices[me].0, n));
            if result.is_err() {
                break;
            }
            signal(&self.node);
            if bounced {
                result = self.wait_peer(
                    "in-place all-to-all (waiting for the pair's partner)",
                    p,
                    base + k as u64 + 1,
                    self.node.pairs(p),
                );
                if result.is_err() {
                    break;
                }
                kernels::copy(work.add(slices[p].0), bounce.as_ptr(), n);
            }
        }
        // Out of place, a rank did not wait for its partners' reads of its input: wait for
        // those now, before the caller may reuse the input. (Staged blocks stay in the slot
        // until every rank has begun a later call: `slot_free`.)
        if !in_place && result.is_ok() {
            for k in 0..m - 1 {
                let p = tournament_partner(me, k, m);
                if p < l {
                    result = self.wait_peer(
                        "all-to-all (waiting for a partner to read this rank's input)",
                        p,
                        base + k as u64 + 1,
                        self.node.pairs(p),
                    );
                    if result.is_err() {
                        break;
                    }
                }
            }
        }
        self.scratch = bounce;
        result
    }

    /// Bytes of a slot's data each local rank's piece may take (a multiple of 64): piece j of a
    /// chunk sits at `j * piece_cap` of the slot's data.
    fn piece_cap(&self) -> usize {
        ((self.node.geo.slot_bytes - SMALL_HDR) / self.local_size()) & !63
    }

    /// Whether this rank's in-place single-copy all-to-all copies the blocks its peers read into
    /// its slot first (`Some(bytes per block in the slot)`): in place only, with blocks of at
    /// most `largest` bytes that fit. Its peers then copy them out of the slot, and it reads
    /// theirs straight into its buffer, where otherwise it reads each into a bounce buffer and
    /// copies it into place once the partner has read the block it overwrites.
    fn alltoall_stages(
        &self,
        mode: NodeMode,
        input: *const u8,
        work: *mut u8,
        largest: usize,
    ) -> Option<usize> {
        let piece_cap = self.piece_cap();
        (mode == NodeMode::AllToAll && std::ptr::eq(input, work) && largest <= piece_cap)
            .then_some(piece_cap)
    }

    /// Read `n` bytes at offset `off` of local rank `j`'s all-to-all input into `dst`: from its
    /// slot where it staged its blocks (it published 1 at [`LINE_SPLIT`];
    /// [`Self::alltoall_stages`]: this rank's block at its index), else from its buffer.
    unsafe fn read_block(
        &self,
        j: usize,
        g: u64,
        dst: *mut u8,
        off: usize,
        n: usize,
    ) -> Result<()> {
        let staged =
            (*(self.node.line(j, g).add(LINE_SPLIT) as *const AtomicU64)).load(Ordering::Relaxed);
        if staged == 0 {
            return self.read_peer(j, g, dst, off, n);
        }
        let from = self.node.chunk_area(j, (g % NSLOT as u64) as usize);
        kernels::copy(dst, from.add(self.node.me * self.piece_cap()), n);
        Ok(())
    }

    /// Where local rank `me`'s piece of the current chunk lives on every local rank, in local
    /// order (the reduction order is fixed, so results do not depend on timing): peers' copies in
    /// their slot `s`, our own still in the caller's buffer at `own`.
    unsafe fn piece_sources(&self, s: usize, piece_cap: usize, own: *const u8) -> Vec<*const u8> {
        let me = self.node.me;
        (0..self.local_size())
            .map(|j| {
                if j == me {
                    own
                } else {
                    self.node.chunk_area(j, s).add(me * piece_cap) as *const u8
                }
            })
            .collect()
    }

    /// The in-node all-reduce, software-pipelined over chunks. Per chunk c (generation g, slot
    /// g mod 3) a rank copies the other ranks' pieces of its input into its slot and publishes
    /// `ready`; once all are ready it reduces its own piece (peers' slots plus its own input)
    /// into its slot and publishes `reduced`; then — before waiting for the peers' reductions —
    /// it already copies chunk c+1 in and publishes `ready` for it; only then does it wait for
    /// every `reduced` of chunk c and copy the reduced pieces out. Both waits thus hide behind a
    /// copy, and memory streams without a pause between phases.
    ///
    /// Slot reuse: chunk c+1 goes into the slot of chunk c-2. Before writing it, this rank saw
    /// every peer `ready` for chunk c, which a peer publishes only after copying chunk c-2 out —
    /// its last read of our slot for chunk c-2. Across calls, the last chunk waits for every
    /// `reduced`, which keeps the invariant the other modes rely on (see [`Self::run`]).
    /// `src`: the call's input ([`NodeOp::input`]). `root`: a reduce to that local rank — the
    /// others neither write their result nor copy pieces out; the root reduces its piece into
    /// its result only, and from [`REDUCE_WRITE_MIN`] the others write their reduced pieces
    /// into it (before they publish `reduced`, which the root waits for on the last chunk).
    unsafe fn allreduce_chunks(
        &mut self,
        call: &NodeOp<'_>,
        src: *const u8,
        piece_cap: usize,
        nchunks: usize,
        stream: bool,
        root: Option<usize>,
    ) -> Result<()> {
        let &NodeOp {
            dtype,
            op,
            work,
            slices,
            desc,
            describe,
            ..
        } = call;
        let l = self.local_size();
        let me = self.node.me;
        let esz = dtype.size();
        // whether this rank needs the result (not a reduce's other ranks)
        let result = root.is_none_or(|r| r == me);
        let total: usize = slices.iter().map(|s| s.1).sum();
        let base = self.gen;
        self.gen += nchunks as u64;
        let gen_of = |c: usize| base + 1 + c as u64;
        let slot_of = |c: usize| (gen_of(c) % NSLOT as u64) as usize;
        let piece = |c: usize, j: usize| -> (usize, usize) {
            let (off, len) = slices[j];
            let (po, pl) = railring_collectives::plan::split(len / esz, nchunks, c);
            (off + po * esz, pl * esz)
        };
        let node = self.node.clone();
        let copy_in = |c: usize| {
            let mine = node.chunk_area(me, slot_of(c));
            for j in (0..l).filter(|&j| j != me) {
                let (o, n) = piece(c, j);
                kernels::copy(mine.add(j * piece_cap), src.add(o), n);
            }
            node.ready(me).store(gen_of(c), Ordering::SeqCst);
            node.ring_bell();
        };
        // a large reduce's other ranks write their reduced pieces straight into the root's
        // result (see REDUCE_WRITE_MIN), which the root publishes beside its descriptor
        let writev = root.is_some() && self.node.single_copy() && total >= REDUCE_WRITE_MIN;
        if writev && result {
            let line = self.node.line(me, gen_of(0));
            (*(line.add(LINE_RESULT) as *const AtomicU64)).store(work as u64, Ordering::Relaxed);
        }
        self.publish_desc(gen_of(0), desc, false);
        copy_in(0);
        // (the bounce goes back to `scratch` at the end; an error leaves a fresh one)
        let mut bounce = Vec::new();
        if writev && !result {
            bounce = std::mem::take(&mut self.scratch);
            bounce.clear();
            bounce.reserve(SINGLE_COPY_REDUCE_PIECE);
        }
        for c in 0..nchunks {
            let (g, s) = (gen_of(c), slot_of(c));
            self.wait_all("collective (waiting for peers' data)", g, |j| {
                self.node.ready(j)
            })?;
            if c == 0 {
                self.check_descs(g, desc, describe)?;
            }
            // our reduced piece goes to our slot (for the peers) and, in the same pass, to our
            // own result
            let (o, n) = piece(c, me);
            let mut srcs = self.piece_sources(s, piece_cap, src.add(o));
            if let Some(r) = root.filter(|_| writev && !result) {
                // reduced a bounce-sized part at a time in the cache, then written out
                let b = bounce.as_mut_ptr();
                let step = SINGLE_COPY_REDUCE_PIECE - SINGLE_COPY_REDUCE_PIECE % esz;
                let mut off = 0;
                while off < n {
                    let k = step.min(n - off);
                    kernels::reduce_many_raw(dtype, op, b, &srcs, k);
                    self.peer_copy(r, gen_of(0), LINE_RESULT, b, o + off, k, true)?;
                    srcs.iter_mut().for_each(|p| *p = p.add(k));
                    off += k;
                }
            } else if root == Some(me) {
                // nobody reads a reduce's root's piece from its slot
                kernels::reduce_many_raw(dtype, op, work.add(o), &srcs, n);
            } else {
                kernels::reduce_many_dual(
                    dtype,
                    op,
                    node.chunk_area(me, s).add(me * piece_cap),
                    result.then(|| (work.add(o), stream)),
                    &srcs,
                    n,
                );
            }
            fence(Ordering::Release);
            node.reduced(me).store(g, Ordering::SeqCst);
            node.ring_bell();
            if c + 1 < nchunks {
                copy_in(c + 1);
            }
            if (!result || writev) && c + 1 < nchunks {
                // a reduce's other rank copies nothing out, nor does its root when the others
                // write their pieces into its result. Its next chunk's wait for `ready` still
                // orders it after the root's copy-out of chunk c-1 (whose slot chunk c+2
                // reuses), as in the all-reduce.
                continue;
            }
            self.wait_all("all-reduce (waiting for peers' reductions)", g, |j| {
                self.node.reduced(j)
            })?;
            if !result || writev {
                // the last chunk: waiting for every `reduced` keeps the invariant across calls
                continue;
            }
            for j in (0..l).filter(|&j| j != me) {
                let (o, n) = piece(c, j);
                let from = node.chunk_area(j, s).add(j * piece_cap);
                copy_result(work.add(o), from, n, stream);
            }
        }
        if writev && !result {
            self.scratch = bounce;
        }
        Ok(())
    }

    /// Wait until what the next generation g uses is free: its header line, last used by
    /// g - NHDR, and (`slot`) its staging slot, last used by g - NSLOT, are finished on every
    /// local rank (a rank publishes `ready` for g only after it finished g-1). Calls that end
    /// with every rank's flag observed leave this true; a small broadcast's root and a small
    /// reduce's other ranks return without waiting, so a rank runs up to NHDR - 1 small calls
    /// ahead of a slow peer (NSLOT - 1 with data in slots). Costs nothing while the least
    /// `ready` seen is recent enough, else one load per local rank.
    fn slot_free(&mut self, slot: bool) -> Result<()> {
        let back = if slot { NSLOT } else { NHDR } as u64;
        let target = (self.gen + 2).saturating_sub(back);
        if self.seen >= target {
            return Ok(());
        }
        // A rank a full ring of header lines ahead waits until the slowest peer is half a ring
        // further (it has published up to gen - 1 already, so every peer can get there), then
        // checks nothing for that many calls: waiting for one line at a time put the peer's
        // `ready` line on every call's path, read here while the peer writes it (2 ranks,
        // railperf -n 30000 -z 1, µs: broadcast 64 B 0.10 -> 0.07, reduce 64 B 0.14 -> 0.11;
        // all-reduce unchanged). Not where ranks outnumber CPUs (see `oversubscribed`).
        let until = if slot || self.oversubscribed {
            target
        } else {
            // (gen - 1 is never below target: NHDR >= 3)
            (target + SLOT_FREE_AHEAD).min(self.gen.saturating_sub(1))
        };
        self.wait_flags(
            "collective (waiting for a peer to finish an earlier call)",
            until,
            |j| self.node.ready(j),
            true,
        )?;
        self.seen = (0..self.local_size())
            .map(|j| self.node.ready(j).load(Ordering::Acquire))
            .min()
            .unwrap_or(until)
            .max(until);
        Ok(())
    }

    /// A small rooted call in one round through the slots: a reduce (`reduce`: every rank
    /// writes its data in its slot and returns, except the root, which waits for them all and
    /// reduces in local-rank order, as the small all-reduce does) or a broadcast (the root
    /// writes its data and returns; every other rank waits for the root's header line, which
    /// carries the generation, the descriptor digest and up to 48 bytes of data, and copies the
    /// data out). Only the waiting side compares descriptors. `src`, `work`: the call's input
    /// and buffer at the first slice's offset.
    unsafe fn small_rooted(
        &mut self,
        call: &NodeOp<'_>,
        src: *const u8,
        work: *mut u8,
        bytes: usize,
        root: usize,
        reduce: bool,
    ) -> Result<()> {
        let &NodeOp {
            dtype,
            op,
            desc,
            describe,
            ..
        } = call;
        let l = self.local_size();
        let me = self.node.me;
        if root >= l {
            return Err(Error::Plan(format!(
                "in-node root {root} of {l} local ranks"
            )));
        }
        self.gen += 1;
        let g = self.gen;
        // (the slot is free: see slot_free). Only what a peer reads is written: a broadcast's
        // root's data, a reduce's others' (its root reduces from its own input: SMALL_REDUCE).
        let writes = reduce != (me == root);
        if writes {
            kernels::copy(self.small_data(me, g, bytes), src, bytes);
        }
        let digest = self.publish_desc(g, desc, true);
        self.node.ring_bell();
        self.hand_over(
            g,
            bytes,
            writes,
            !reduce || (me != root && !self.oversubscribed),
        );
        let hdr = |j: usize| -> &AtomicU64 { &*(self.node.line(j, g) as *const AtomicU64) };
        if reduce {
            if me != root {
                return Ok(());
            }
            self.fetch_peers(g, bytes);
            self.wait_flags("reduce (waiting for peers' data)", g, hdr, true)?;
            self.check_digests(g, desc, digest, describe)?;
            self.reduce_small_data(g, bytes, 0, bytes, dtype, op, work, Some(src));
            return Ok(());
        }
        if me == root {
            if !std::ptr::eq(src, work) {
                kernels::copy(work, src, bytes);
            }
            return Ok(());
        }
        self.wait_peer_flag(
            "broadcast (waiting for the root's data)",
            root,
            g,
            hdr(root),
            true,
        )?;
        // the root's header line, its generation seen: the digest is the root's for this call
        let theirs =
            (*(self.node.line(root, g).add(8) as *const AtomicU64)).load(Ordering::Relaxed);
        if theirs != digest {
            self.check_desc_of(root, g, desc, describe)?;
        }
        kernels::copy(work, self.small_data(root, g, bytes), bytes);
        Ok(())
    }

    /// A small reduce's root, before it waits: start loading into its CPU's cache what it is
    /// about to wait for and read — every peer's header line of generation `g` and, for data of
    /// `bytes` outside the line (up to [`HAND_OVER_BOX`]), the box's lines, so their transfer
    /// overlaps the line's (reading the box after seeing the line was a second cross-core
    /// transfer in turn), and the peers' header lines of `g + 1`: the peers return without
    /// waiting and run calls ahead of the root. Hints only: a line loaded before its writer
    /// stores it is taken back by the store and read again after the flag is seen. railperf
    /// reduce -n 100000 -z 1, medians of 6-8 interleaved launches, µs out of place, without
    /// against with (Open MPI): 2 ranks 64 B 0.26 / 0.21 (0.27), 256 B 0.27 / 0.23 (0.39),
    /// 512 B 0.26 / 0.22 (1.29); 4 ranks on 2 CPUs 32 B 0.59 / 0.46 (0.79), 64 B 0.61 / 0.49
    /// (0.88), 512 B 0.91 / 0.69 (3.75). The symmetric small calls (all-reduce, all-gather,
    /// all-to-all) measured the same or up to 10 % slower with it: their peers publish in step
    /// with the reader, so a line it loads early is often one still to be written.
    fn fetch_peers(&self, g: u64, bytes: usize) {
        let me = self.node.me;
        let boxed = bytes > SMALL_INLINE && bytes <= HAND_OVER_BOX;
        for j in (0..self.local_size()).filter(|&j| j != me) {
            super::hint::fetch(self.node.line(j, g), 1);
            if boxed {
                super::hint::fetch(self.node.small_box(j, g), bytes.div_ceil(64));
            }
            super::hint::fetch(self.node.line(j, g + 1), 1);
        }
    }

    /// Where local rank `j`'s data of a small call of `bytes` in generation `g` lives: inside
    /// its header line when it fits (one line carries flag, digest and data), else in its
    /// small-data box of `g`, else in its staging slot after the line the chunked calls leave
    /// unused.
    fn small_data(&self, j: usize, g: u64, bytes: usize) -> *mut u8 {
        // SAFETY: inside the mapping (the caller checked that `bytes` fit in a slot).
        unsafe {
            if bytes <= SMALL_INLINE {
                self.node.line(j, g).add(16)
            } else if bytes <= SMALL_BOX {
                self.node.small_box(j, g)
            } else {
                self.node
                    .stage(j, (g % NSLOT as u64) as usize)
                    .add(SMALL_HDR)
            }
        }
    }

    /// The small all-reduce of `call`: `bytes` from `src` (its input) into `work`, both at the
    /// first slice's offset.
    unsafe fn small_allreduce(
        &mut self,
        call: &NodeOp<'_>,
        src: *const u8,
        work: *mut u8,
        bytes: usize,
    ) -> Result<()> {
        let &NodeOp {
            dtype,
            op,
            desc,
            describe,
            ..
        } = call;
        // One cache line carries flag, descriptor and (up to 48 bytes) data: the generation's
        // header line [generation u64 | descriptor digest u64 | 48 inline bytes]; larger data
        // goes to the generation's box or slot (small_data). A peer polls that line and, for the
        // common tiny call, finds everything it needs in that one transfer. The full descriptor
        // sits beside it, read only when digests differ (to name both calls).
        let me = self.node.me;
        self.gen += 1;
        let g = self.gen;
        // (the line, box or slot is free: see slot_free)
        let hdr = |j: usize| -> &AtomicU64 { &*(self.node.line(j, g) as *const AtomicU64) };
        kernels::copy(self.small_data(me, g, bytes), src, bytes);
        let digest = self.publish_desc(g, desc, true);
        self.node.ring_bell();
        if !self.oversubscribed {
            self.hand_over(g, bytes, true, true);
        }
        self.wait_flags("all-reduce (waiting for peers' data)", g, hdr, true)?;
        self.check_digests(g, desc, digest, describe)?;
        self.reduce_small_data(g, bytes, 0, bytes, dtype, op, work, None);
        Ok(())
    }

    /// The small all-gather, all-to-all or reduce-scatter of `call` in one round, as the small
    /// all-reduce goes: each rank writes what its peers need — an all-gather its block, the
    /// others their whole input (`bytes` from offset `base`) — beside its header line (inline
    /// up to 48 bytes, else in its box), publishes the line, waits for every peer's, and takes
    /// its part from theirs: one cache line from each peer for the tiny calls, where the staged
    /// path waits for a flag and then fetches the data from the peer's slot.
    unsafe fn small_exchange(
        &mut self,
        call: &NodeOp<'_>,
        base: usize,
        bytes: usize,
    ) -> Result<()> {
        let &NodeOp {
            mode,
            dtype,
            op,
            work,
            slices,
            desc,
            describe,
            ..
        } = call;
        let src = call.input();
        let (me, l) = (self.node.me, self.local_size());
        self.gen += 1;
        let g = self.gen;
        // (the line or box is free: see slot_free)
        let hdr = |j: usize| -> &AtomicU64 { &*(self.node.line(j, g) as *const AtomicU64) };
        // what rank j published, and how many bytes
        let published = |j: usize| -> usize {
            if mode == NodeMode::AllGather {
                slices[j].1
            } else {
                bytes
            }
        };
        let (o, n) = slices[me];
        if mode == NodeMode::AllGather {
            // (src may stand for a buffer holding only this rank's slice: see NodeOp)
            kernels::copy(self.small_data(me, g, n), src.wrapping_add(o), n);
        } else {
            kernels::copy(self.small_data(me, g, bytes), src.add(base), bytes);
        }
        let digest = self.publish_desc(g, desc, true);
        self.node.ring_bell();
        if !self.oversubscribed {
            self.hand_over(g, published(me), true, true);
        }
        self.wait_flags("collective (waiting for peers' data)", g, hdr, true)?;
        self.check_digests(g, desc, digest, describe)?;
        match mode {
            NodeMode::AllGather => {
                for j in (0..l).filter(|&j| j != me) {
                    let (oj, nj) = slices[j];
                    let from = self.small_data(j, g, published(j));
                    kernels::copy(work.add(oj), from, nj);
                }
                if !std::ptr::eq(src, work) {
                    kernels::copy(work.add(o), src.wrapping_add(o), n);
                }
            }
            NodeMode::AllToAll => {
                // peer j's block for this rank sits at this rank's offset in j's input
                for j in (0..l).filter(|&j| j != me) {
                    let from = self.small_data(j, g, bytes).add(o - base);
                    kernels::copy(work.add(slices[j].0), from, slices[j].1);
                }
                if !std::ptr::eq(src, work) {
                    kernels::copy(work.add(o), src.add(o), n);
                }
            }
            // reduce-scatter: this rank's piece of every rank's input
            _ => self.reduce_small_data(g, bytes, o - base, n, dtype, op, work.add(o), None),
        }
        Ok(())
    }

    /// Reduce `n` bytes at offset `off` of every local rank's small data of generation `g` (each
    /// `bytes` long) into `dst`, in local-rank order (so every rank that does it gets identical
    /// results); this rank's from `own` (its input, not copied: a reduce's root) where given.
    ///
    /// # Safety
    /// Every rank's data of `g` is published; `dst` valid for `n` bytes of writes, `own` for
    /// `bytes` of reads (it may be `dst`: the kernels read every source before they write).
    #[allow(clippy::too_many_arguments)]
    unsafe fn reduce_small_data(
        &self,
        g: u64,
        bytes: usize,
        off: usize,
        n: usize,
        dtype: railring_collectives::DataType,
        op: railring_collectives::ReduceOp,
        dst: *mut u8,
        own: Option<*const u8>,
    ) {
        let l = self.local_size();
        let me = self.node.me;
        let piece = |j: usize| match own {
            Some(p) if j == me => p.add(off),
            _ => self.small_data(j, g, bytes).add(off) as *const u8,
        };
        let mut fixed = [std::ptr::null::<u8>(); 64];
        let heap: Vec<*const u8>;
        let srcs: &[*const u8] = if l <= fixed.len() {
            for (j, p) in fixed.iter_mut().enumerate().take(l) {
                *p = piece(j);
            }
            &fixed[..l]
        } else {
            heap = (0..l).map(piece).collect();
            &heap
        };
        kernels::reduce_many_raw(dtype, op, dst, srcs, n);
    }

    /// Publish this rank's call for generation `g`: the full descriptor in the control block,
    /// its digest and `g` in the generation's header line (what small calls poll) and, for a
    /// small call (`ready`), `g` in `ready` (what chunked modes poll; they store it themselves
    /// once their data is in) — so a peer in either kind of call finds a mismatch instead of
    /// waiting for a flag that never comes.
    ///
    /// # Safety
    /// The header line of `g` is free (see [`Self::slot_free`]).
    unsafe fn publish_desc(&self, g: u64, desc: &[u8; DESC], ready: bool) -> u64 {
        let digest = desc_digest(desc);
        let me = self.node.me;
        std::ptr::copy_nonoverlapping(desc.as_ptr(), self.node.desc_ptr(me, g), DESC);
        let line = self.node.line(me, g);
        (*(line.add(8) as *const AtomicU64)).store(digest, Ordering::Relaxed);
        // At most one sequentially consistent store per call, the last: it orders the line
        // before the bell's sleeper check (ring_bell) as the bell protocol needs, and a second
        // one cost a small call its critical path (on x86 each is an `xchg` that waits until
        // the store buffer drains, here the line a peer is polling: 2-rank 8 B broadcast 0.17
        // -> 0.11 us). None where sleepers fence for us (`publish_order`: 2 ranks, 8 B
        // broadcast and reduce 0.14 -> 0.12 us).
        let order = self.node.publish_order();
        if ready {
            (*(line as *const AtomicU64)).store(g, Ordering::Release);
            self.node.ready(me).store(g, order);
        } else {
            (*(line as *const AtomicU64)).store(g, order);
        }
        digest
    }

    /// After publishing generation `g`'s header line and `bytes` of data beside it (a small
    /// call of at most [`HAND_OVER_BOX`] bytes; [`super::hint`]): push the line, when peers read
    /// it (`read`: this rank wrote data for them), and the data's lines in the box towards the
    /// shared cache, and take ownership of the box's lines of the next generation (where it
    /// writes data: `read`) and (`own_line`) of its header line.
    ///
    /// 2 ranks, railperf -n 30000 -z 1, 4 interleaved launches, medians µs out of place (Open
    /// MPI): broadcast 8 B 0.10 -> 0.07 (0.08), 64 B 0.11 -> 0.095 (0.165); reduce 512 B 0.175
    /// -> 0.13 (1.03); all-reduce 64 B 0.375 -> 0.29 (0.45); all-gather 512 B 0.445 -> 0.345
    /// (0.535); all-to-all 64 B 0.39 -> 0.33 (0.405). A reduce's writers owning their next
    /// header line took 8 B from 0.10 to 0.08 (0.10); its root owning its own too made it 0.12
    /// (it polls the writers' lines), so the root leaves it, and so do the writers where ranks
    /// outnumber CPUs (4 ranks, 8 B: 0.276 against 0.301 with); boxes of 4 KiB took 0.33
    /// -> 0.78 µs to broadcast with 64 lines handed over each way, and out of place even the
    /// header line's hints cost it (0.33 -> 0.45), hence the limit.
    fn hand_over(&self, g: u64, bytes: usize, read: bool, own_line: bool) {
        if bytes > HAND_OVER_BOX {
            return;
        }
        let me = self.node.me;
        let boxed = bytes > SMALL_INLINE;
        let lines = if boxed { bytes.div_ceil(64) } else { 0 };
        if read {
            self.hints.demote(self.node.line(me, g), 1);
            self.hints.demote(self.node.small_box(me, g), lines);
            self.hints.own(self.node.small_box(me, g + 1), lines);
        }
        if own_line {
            self.hints.own(self.node.line(me, g + 1), 1);
        }
    }

    /// Compare every peer's digest for generation `g` with ours; on a difference read the peer's
    /// full descriptor and fail naming both calls.
    fn check_digests(
        &self,
        g: u64,
        desc: &[u8; DESC],
        digest: u64,
        describe: &dyn Fn(&[u8; DESC]) -> String,
    ) -> Result<()> {
        for j in 0..self.local_size() {
            // SAFETY: the header line of generation g, inside the mapping; its generation was seen.
            let theirs = unsafe {
                (*(self.node.line(j, g).add(8) as *const AtomicU64)).load(Ordering::Relaxed)
            };
            if theirs != digest {
                return self.check_descs(g, desc, describe);
            }
        }
        Ok(())
    }

    fn check_descs(
        &self,
        g: u64,
        desc: &[u8; DESC],
        describe: &dyn Fn(&[u8; DESC]) -> String,
    ) -> Result<()> {
        for j in 0..self.local_size() {
            self.check_desc_of(j, g, desc, describe)?;
        }
        Ok(())
    }

    /// The sizes (of the largest block; a reduce's: of the whole call) at which a call of `mode`
    /// reads peers' buffers directly; empty where it always stages. Where two ranks' kernel
    /// copies fast ([`Node::large_single`]) there is no upper limit and the least sizes are
    /// smaller (`FAST_KERNEL_*_MIN`), and a reduce reads too; a node whose ranks outnumber its
    /// CPUs (`alltoall_single_min` unbounded) stages every all-to-all.
    fn single_copy_sizes(&self, mode: NodeMode) -> std::ops::Range<usize> {
        if !self.node.single_copy() {
            return 0..0;
        }
        let pair = self.local_size() == 2;
        let fast = pair && self.node.large_single();
        let alltoall_min = self.node.alltoall_single_min();
        match mode {
            NodeMode::AllToAll if alltoall_min == usize::MAX => 0..0,
            NodeMode::AllToAll if fast => FAST_KERNEL_PAIR_MIN..usize::MAX,
            NodeMode::AllToAll => alltoall_min..SINGLE_COPY_ALLTOALL_MAX,
            NodeMode::AllGather if fast => FAST_KERNEL_PAIR_MIN..usize::MAX,
            NodeMode::AllGather if pair => SINGLE_COPY_PAIR_MIN..SINGLE_COPY_PAIR_MAX,
            NodeMode::Broadcast { .. } if fast => FAST_KERNEL_BROADCAST_MIN..usize::MAX,
            NodeMode::Broadcast { .. } if pair => SINGLE_COPY_PAIR_MIN..SINGLE_COPY_BROADCAST_MAX,
            NodeMode::Broadcast { .. } if self.local_size() <= 4 => {
                TREE_BROADCAST_MIN..TREE_BROADCAST_MAX + 1
            }
            NodeMode::Broadcast { .. } => TREE_BROADCAST_MIN..TREE_BROADCAST_MAX_MANY + 1,
            NodeMode::Reduce { .. } if fast => SINGLE_COPY_REDUCE_MIN..usize::MAX,
            NodeMode::AllReduce | NodeMode::AllReduceSmall if fast => {
                SINGLE_COPY_ALLREDUCE_MIN..usize::MAX
            }
            _ => 0..0,
        }
    }

    /// The all-to-all blocks a crowded node reads directly only when every local rank calls
    /// out of place ([`CROWDED_ALLTOALL_OOP_MAX`], [`Self::all_out_of_place`]); empty unless
    /// the node has more than two ranks, they outnumber its CPUs and its all-to-all reads
    /// directly ([`Node::alltoall_single_min`]).
    fn crowded_out_of_place_sizes(&self) -> std::ops::Range<usize> {
        if self.crowded_reads_fast() {
            SINGLE_COPY_ALLTOALL_MAX..CROWDED_ALLTOALL_OOP_MAX
        } else {
            0..0
        }
    }

    /// The broadcasts a crowded node reads directly when the root calls out of place
    /// ([`CROWDED_BROADCAST_OOP_MIN`], [`Self::root_out_of_place`]); empty where
    /// [`Self::crowded_out_of_place_sizes`] is. Never under `NSLOT` slots' worth (a larger
    /// `RAILRING_SHM_SLOT` raises the start): staged, such a broadcast waits for every peer
    /// before its third chunk, which the root's word relies on.
    fn crowded_broadcast_sizes(&self) -> std::ops::Range<usize> {
        if self.crowded_reads_fast() {
            let slot = self.node.geo.slot_bytes - SMALL_HDR;
            CROWDED_BROADCAST_OOP_MIN.max(NSLOT * slot)..CROWDED_BROADCAST_OOP_MAX
        } else {
            0..0
        }
    }

    /// More than two local ranks, more than the node's CPUs, every one able to read every
    /// other's memory, and the node's all-to-all reads directly (its kernel copy was timed fast
    /// at set-up, or it was told `on`).
    fn crowded_reads_fast(&self) -> bool {
        let node = &self.node;
        node.single_copy()
            && node.crowded()
            && self.local_size() > 2
            && node.alltoall_single_min() != usize::MAX
    }

    /// Does the root of this broadcast call out of place (`out_of_place`: this rank's own
    /// answer, which counts only on the root)? The root says so in its `placement` word for
    /// the call's first generation and goes on; every other rank waits for that word (or for
    /// the root's header line of that generation without it: a root in another call, which the
    /// staged path's descriptor check then names) and reads it again after, so all take the
    /// root's path. The root's word cannot move on before every peer read it: read directly,
    /// the root returns only once every peer has read its block; staged, its third chunk waits
    /// until every peer published `ready` for the first, which a peer does after reading the
    /// word (such a broadcast fills at least `NSLOT` slots: [`Self::crowded_broadcast_sizes`]).
    fn root_out_of_place(&self, root: usize, out_of_place: bool) -> Result<bool> {
        let g = self.gen + 1;
        let me = self.node.me;
        if me == root {
            self.node
                .placement(me)
                .store(2 * g + u64::from(out_of_place), Ordering::SeqCst);
            self.node.ring_bell();
            return Ok(out_of_place);
        }
        let said = self.node.placement(root);
        // SAFETY: the header line's first word, inside the mapping.
        let line = unsafe { &*(self.node.line(root, g) as *const AtomicU64) };
        let elsewhere = AtomicU64::new(u64::MAX);
        self.wait_all(
            "broadcast (waiting for the root to say whether it calls in place)",
            2 * g,
            |j| {
                if j != root
                    || said.load(Ordering::Acquire) < 2 * g && line.load(Ordering::Acquire) >= g
                {
                    &elsewhere
                } else {
                    said
                }
            },
        )?;
        Ok(said.load(Ordering::Acquire) == 2 * g + 1)
    }

    /// Does every local rank call this all-to-all out of place (`out_of_place`: this one
    /// does)? Each rank says how it calls before anything else (its `placement` word, for the
    /// call's first generation). A rank calling in place knows the answer and goes on at once;
    /// one calling out of place waits until every peer said (or published its header line for
    /// that generation without saying: a peer in another call, small or large, which the staged
    /// path's descriptor check then names). The answer is the same on every rank, so all take one path. No
    /// rank's word can move on before every peer read it: the call it belongs to does not
    /// end on any rank before every rank has begun it.
    fn all_out_of_place(&self, out_of_place: bool) -> Result<bool> {
        let g = self.gen + 1;
        let me = self.node.me;
        self.node
            .placement(me)
            .store(2 * g + u64::from(out_of_place), Ordering::SeqCst);
        self.node.ring_bell();
        if !out_of_place {
            return Ok(false);
        }
        let elsewhere = AtomicU64::new(u64::MAX);
        self.wait_all(
            "all-to-all (waiting for peers to say whether they call in place)",
            2 * g,
            |j| {
                let said = self.node.placement(j);
                // SAFETY: the header line's first word, inside the mapping.
                let line = unsafe { &*(self.node.line(j, g) as *const AtomicU64) };
                if said.load(Ordering::Acquire) < 2 * g && line.load(Ordering::Acquire) >= g {
                    &elsewhere
                } else {
                    said
                }
            },
        )?;
        Ok((0..self.local_size())
            .all(|j| self.node.placement(j).load(Ordering::Acquire) == 2 * g + 1))
    }

    /// Wait until local rank `j` published its buffers for generation `g` (a single-copy call),
    /// then check that it is in the same call.
    fn wait_buffer(
        &self,
        what: &str,
        j: usize,
        g: u64,
        desc: &[u8; DESC],
        describe: &dyn Fn(&[u8; DESC]) -> String,
    ) -> Result<()> {
        self.wait_peer(what, j, g, self.node.ready(j))?;
        self.check_desc_of(j, g, desc, describe)
    }

    /// Compare local rank `j`'s descriptor of generation `g` with ours; fail naming both calls.
    fn check_desc_of(
        &self,
        j: usize,
        g: u64,
        desc: &[u8; DESC],
        describe: &dyn Fn(&[u8; DESC]) -> String,
    ) -> Result<()> {
        let mut theirs = [0u8; DESC];
        // SAFETY: inside the mapping; the peer does not rewrite it before we mark done.
        unsafe {
            std::ptr::copy_nonoverlapping(self.node.desc_ptr(j, g), theirs.as_mut_ptr(), DESC)
        };
        if &theirs != desc {
            return Err(Error::Mismatch {
                rank: self.rank,
                peer: who(&self.node, j),
                mine: describe(desc),
                theirs: describe(&theirs),
            });
        }
        Ok(())
    }
}

impl crate::transport::NodeFabric for ShmFabric {
    fn ranks(&self) -> &[usize] {
        &self.node.ranks
    }
    unsafe fn node_op(&mut self, call: NodeOp<'_>) -> Result<()> {
        self.run(call)
    }
}

#[cfg(test)]
mod tests {
    use super::tournament_partner;

    #[test]
    fn every_pair_meets_exactly_once_in_the_tournament() {
        for l in 1..=17usize {
            let m = l + (l % 2);
            let mut met = vec![vec![0u32; l]; l];
            for k in 0..m.saturating_sub(1) {
                for (r, row) in met.iter_mut().enumerate() {
                    let p = tournament_partner(r, k, m);
                    assert_ne!(p, r, "l={l} round {k}: rank {r} meets itself");
                    if p < l {
                        assert_eq!(
                            tournament_partner(p, k, m),
                            r,
                            "l={l} round {k}: not mutual"
                        );
                        row[p] += 1;
                    } else {
                        assert_eq!(l % 2, 1, "l={l}: a bye with an even number of ranks");
                    }
                }
            }
            for (r, row) in met.iter().enumerate() {
                for (p, &times) in row.iter().enumerate().filter(|&(p, _)| p != r) {
                    assert_eq!(times, 1, "l={l}: {r} and {p} met {times} times");
                }
            }
        }
    }
}

#[cfg(test)]
mod direct_tests {
    use super::super::Geometry;
    use super::*;
    use railring_collectives::{DataType, ReduceOp};

    /// Element `t` of the block rank `r` sends rank `j`: which rank, block and element, exactly.
    fn value(r: usize, j: usize, t: usize) -> u32 {
        ((r as u32) << 28) | ((j as u32) << 24) | t as u32
    }

    /// One call of `mode` over u32 on `fab`, out of place from `src` (which stands for the
    /// input at `work`'s offsets) or in place; the descriptor is `[desc; DESC]`, described as
    /// "call {desc}".
    ///
    /// # Safety
    /// `src`, where given, valid for reads over every slice.
    unsafe fn run_u32(
        fab: &mut ShmFabric,
        mode: NodeMode,
        src: Option<*const u8>,
        work: &mut [u32],
        slices: &[(usize, usize)],
        desc: u8,
    ) -> Result<()> {
        fab.run(NodeOp {
            mode,
            dtype: DataType::U32,
            op: ReduceOp::Sum,
            src,
            work: work.as_mut_ptr() as *mut u8,
            slices,
            desc: &[desc; DESC],
            describe: &|d| format!("call {}", d[0]),
        })
    }

    /// `l` local ranks (threads of this process) on a node that reads directly (`large`: at
    /// every size, as two ranks whose kernel copies fast), each running `body` with its fabric;
    /// their results in local order.
    fn node_of<T: Send + 'static>(
        l: usize,
        tag: &str,
        large: bool,
        crowded: bool,
        body: impl Fn(&mut ShmFabric) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let dir = std::env::temp_dir().join(format!("rr-crowded-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("railring-seg");
        let geo = Geometry {
            local_size: l,
            slot_bytes: (1 << 20) + SMALL_HDR,
            ring_bytes: 4096,
        };
        let ranks: Vec<usize> = (0..l).collect();
        let body = Arc::new(body);
        let threads: Vec<_> = (0..l)
            .map(|me| Node::open(&path, geo, ranks.clone(), me, "h".into(), me == 0).unwrap())
            .collect::<Vec<_>>()
            .into_iter()
            .map(|node| {
                let body = body.clone();
                std::thread::spawn(move || {
                    node.set_single_copy(true, SINGLE_COPY_ALLTOALL_MIN, large, crowded);
                    body(&mut ShmFabric::new(node, Duration::from_secs(30)))
                })
            })
            .collect();
        let out = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    /// One all-to-all of `n` u32 per block on each of 4 local ranks (threads of this process,
    /// which can read each other's memory), rank `j` calling in place where `in_place(j)`; the
    /// results checked element by element on every rank, and for each rank whether it read
    /// its peers' buffers directly (the pairwise path's progress word moved to this call).
    fn alltoall(crowded: bool, n: usize, in_place: fn(usize) -> bool) -> Vec<bool> {
        alltoall_yields(crowded, n, in_place)
            .into_iter()
            .map(|(direct, _)| direct)
            .collect()
    }

    /// [`alltoall`], with the yields each rank's waits allowed themselves in the call.
    fn alltoall_yields(crowded: bool, n: usize, in_place: fn(usize) -> bool) -> Vec<(bool, u32)> {
        let l = 4;
        let tag = format!(
            "{crowded}-{n}-{}",
            (0..l)
                .map(|j| u8::from(in_place(j)).to_string())
                .collect::<String>()
        );
        node_of(4, &tag, false, crowded, move |fab| {
            let me = fab.node.me;
            let input: Vec<u32> = (0..l * n).map(|i| value(me, i / n, i % n)).collect();
            let mut work = if in_place(me) {
                input.clone()
            } else {
                vec![u32::MAX; l * n]
            };
            let slices: Vec<(usize, usize)> = (0..l).map(|j| (j * n * 4, n * 4)).collect();
            let before = fab.gen;
            let src = (!in_place(me)).then_some(input.as_ptr() as *const u8);
            // SAFETY: both buffers hold l * n u32 and outlive the call.
            unsafe { run_u32(fab, NodeMode::AllToAll, src, &mut work, &slices, 7).unwrap() };
            for (i, &got) in work.iter().enumerate() {
                let want = value(i / n, me, i % n);
                assert_eq!(got, want, "rank {me} element {i}");
            }
            (
                fab.node.pairs(me).load(Ordering::Acquire) >> 24 == before + 1,
                fab.yield_limit,
            )
        })
    }

    /// One all-gather of `n` u32 per block on `fab`'s node, this rank calling in place or out of
    /// place (its input holding only its own block); the result checked element by element.
    /// Returns the call's generation and the result's address.
    fn all_gather(fab: &mut ShmFabric, n: usize, in_place: bool) -> (u64, u64) {
        let (me, l) = (fab.node.me, fab.local_size());
        let mine: Vec<u32> = (0..n).map(|t| value(me, me, t)).collect();
        let mut work = vec![u32::MAX; l * n];
        if in_place {
            work[me * n..(me + 1) * n].copy_from_slice(&mine);
        }
        let slices: Vec<(usize, usize)> = (0..l).map(|j| (j * n * 4, n * 4)).collect();
        let g = fab.gen + 1;
        let src = (mine.as_ptr() as *const u8).wrapping_sub(me * n * 4);
        let src = (!in_place).then_some(src);
        // SAFETY: `src` stands for this rank's slice of the call's input (NodeOp), which `mine`
        // holds; `work` holds every block; both outlive the call.
        unsafe { run_u32(fab, NodeMode::AllGather, src, &mut work, &slices, 9) }.unwrap();
        for (i, &got) in work.iter().enumerate() {
            assert_eq!(got, value(i / n, i / n, i % n), "rank {me} element {i}");
        }
        (g, work.as_ptr() as u64)
    }

    /// On a crowded node whose all-to-all reads directly, blocks from
    /// [`SINGLE_COPY_ALLTOALL_MAX`] read directly only when every rank calls out of place; in
    /// place, or with one rank in place, every rank stages; a node that is not crowded stages
    /// them whatever the placement. Exact everywhere.
    #[test]
    fn a_crowded_node_reads_large_blocks_directly_only_when_all_call_out_of_place() {
        let n = (SINGLE_COPY_ALLTOALL_MAX + 8192) / 4;
        assert_eq!(alltoall(true, n, |_| false), [true; 4]);
        assert_eq!(alltoall(true, n, |_| true), [false; 4]);
        assert_eq!(alltoall(true, n, |j| j == 2), [false; 4]);
        assert_eq!(alltoall(false, n, |_| false), [false; 4]);
        // past the limit: staged
        assert_eq!(
            alltoall(true, CROWDED_ALLTOALL_OOP_MAX / 4, |_| false),
            [false; 4]
        );
        // below it (already read directly): whatever the placement
        assert_eq!(alltoall(true, 16 << 10, |j| j == 2), [true; 4]);
    }

    /// A crowded node's out-of-place all-to-all with blocks from [`CROWDED_ALLTOALL_SLEEP_MIN`]
    /// reads them directly and its waits sleep without yielding; smaller blocks, or in place,
    /// keep the oversubscribed default. Exact everywhere (the large calls copy their own block
    /// with streaming stores: from [`STREAM_MIN`] bytes, an odd number of elements).
    #[test]
    fn a_crowded_large_all_to_all_sleeps_without_yielding() {
        let big = CROWDED_ALLTOALL_SLEEP_MIN / 4 + 3;
        assert_eq!(alltoall_yields(true, big, |_| false), [(true, 0); 4]);
        let small = CROWDED_ALLTOALL_SLEEP_MIN / 4 - 5;
        assert!(alltoall_yields(true, small, |_| false)
            .iter()
            .all(|&(direct, yields)| direct && yields > 0));
        assert!(alltoall_yields(true, big, |_| true)
            .iter()
            .all(|&(direct, yields)| !direct && yields > 0));
    }

    /// A staged all-to-all and all-gather large enough to write their results with streaming
    /// stores (from [`STREAM_MIN`] bytes out of place: peers' blocks and the rank's own), on 4
    /// ranks with blocks of an odd number of elements: exact on every rank, out of place and
    /// with one rank in place.
    #[test]
    fn large_staged_calls_write_exact_results_with_streaming_stores() {
        let n = STREAM_MIN / 16 + 37;
        assert_eq!(alltoall(false, n, |_| false), [false; 4]);
        assert_eq!(alltoall(false, n, |j| j == 1), [false; 4]);
        for in_place in [[false; 4], [false, false, true, false]] {
            let tag = format!("ag-stream-{in_place:?}").replace([' ', ',', '[', ']'], "");
            node_of(4, &tag, false, false, move |fab| {
                all_gather(fab, n, in_place[fab.node.me]);
            });
        }
    }

    /// A rank in another call (a small all-reduce) while its peers wait to hear how it calls
    /// the all-to-all: every rank fails naming the mismatch, none waits for its timeout.
    #[test]
    fn a_peer_in_another_call_fails_the_agreement_at_once() {
        let n = (SINGLE_COPY_ALLTOALL_MAX + 8192) / 4;
        let t = Instant::now();
        let errs = node_of(4, "mismatch", false, true, move |fab| {
            let me = fab.node.me;
            let input = vec![1u32; 4 * n];
            let mut work = vec![0u32; 4 * n];
            let slices: Vec<(usize, usize)> = if me == 3 {
                vec![(0, 40)]
            } else {
                (0..4).map(|j| (j * n * 4, n * 4)).collect()
            };
            let (mode, desc) = if me == 3 {
                (NodeMode::AllReduceSmall, 8)
            } else {
                (NodeMode::AllToAll, 7)
            };
            let src = Some(input.as_ptr() as *const u8);
            // SAFETY: both buffers hold 4 * n u32 and outlive the call.
            unsafe { run_u32(fab, mode, src, &mut work, &slices, desc) }.map_err(|e| e.to_string())
        });
        for (r, e) in errs.iter().enumerate() {
            let e = e.as_ref().expect_err("a mismatched call succeeded");
            assert!(
                e.contains("call 7") && e.contains("call 8"),
                "rank {r}: {e}"
            );
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    }

    /// Two ranks whose kernel copies fast: an all-gather of large blocks writes each rank's
    /// block into its peer's result (it published where that is), smaller blocks are read;
    /// exact out of place, in place and mixed.
    #[test]
    fn a_large_two_rank_all_gather_writes_into_the_peer() {
        for (n, pushed) in [(PUSH_ALL_GATHER_MIN / 4 + 1000, true), (16 << 10, false)] {
            for in_place in [[false, false], [true, true], [true, false]] {
                let tag = format!("ag-{n}-{in_place:?}").replace([' ', ',', '[', ']'], "");
                let published = node_of(2, &tag, true, false, move |fab| {
                    let me = fab.node.me;
                    let (g, work) = all_gather(fab, n, in_place[me]);
                    // SAFETY: a word of this rank's header line, inside the mapping.
                    let result = unsafe {
                        (*(fab.node.line(me, g).add(LINE_RESULT) as *const AtomicU64))
                            .load(Ordering::Acquire)
                    };
                    result == work
                });
                assert_eq!(
                    published, [pushed; 2],
                    "{n} u32 a block, in place {in_place:?}"
                );
            }
        }
    }
}
