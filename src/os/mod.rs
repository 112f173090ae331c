//! What `quotad serve` asks of the operating system: `sched` (the HTTP workers' time slice) and
//! `memory` (transparent huge pages off, the allocator's purge delay), each set once at start.

pub mod memory;
pub mod sched;
