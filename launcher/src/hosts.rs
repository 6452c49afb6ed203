//! hosts
