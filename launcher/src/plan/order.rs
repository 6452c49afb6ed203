//! Fabric-aware node order (placeholder).
