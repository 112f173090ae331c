//! What `quotad serve` asks of the operating system: `sched` (the HTTP workers' time slice),
//! `memory` (transparent huge pages off, the allocator's purge delay) and `files` (the
//! open-files limit raised to its hard limit), each set once at start.

pub mod files;
pub mod memory;
pub mod sched;
