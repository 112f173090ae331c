//! Embedded store (placeholder).
