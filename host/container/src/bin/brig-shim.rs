//! `brig-shim`: the per-container helper the node starts. Not for direct use; see
//! `brig_container::shim`.
#![forbid(unsafe_code)]

fn main() {
    if let Err(e) = brig_container::shim::run() {
        eprintln!("brig-shim: {}", brig_container::shim::describe(&e));
        std::process::exit(1);
    }
}
