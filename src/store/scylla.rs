//! Scylla store (placeholder).
