//! Topology model and loaders.
