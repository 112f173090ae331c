//! The limiter: window arithmetic, the in-memory pre-check and the decision.
pub mod window;
