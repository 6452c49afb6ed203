//! Shared code of the examples: the nccl-tests-style benchmark driver behind `railperf`.

pub mod perf;
