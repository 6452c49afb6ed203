//! Emulated cluster harness.
