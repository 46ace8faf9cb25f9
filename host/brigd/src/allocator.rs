//! glibc's allocator, tuned for a long-running daemon. By default glibc gives every thread that
//! allocates under contention an arena of its own, up to eight per core, and keeps what each
//! arena once held: brigd's async workers, its blocking pool (file work, exec pumps) and its
//! QUIC tasks spread a burst over many arenas, and the daemon's resident memory stays at the
//! burst's peak long after (a 40 MB output read slowly through the E2B API left brigd +40 to
//! +61 MiB; with one arena per core, +27 to +36 MiB in two runs each). One arena per core keeps contention low
//! (brigd runs about one busy thread per core) and what a burst took comes back to few places.
#![allow(unsafe_code)]

/// Caps glibc's arenas at one per core (at least two). Call first in `main`, before any
/// thread is started.
pub fn one_arena_per_core() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
    let arenas = libc::c_int::try_from(cores).unwrap_or(libc::c_int::MAX);
    // SAFETY: `mallopt` only sets a tuning parameter of glibc's allocator; `M_ARENA_MAX` with a
    // positive count is a valid pair, and it runs before `main` starts any thread, so no
    // allocation is under way in another thread while the setting changes.
    let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
    if set != 1 {
        // Not fatal: the default (more arenas) is only less thrifty.
        eprintln!("brigd: glibc did not take M_ARENA_MAX={arenas}");
    }
}
