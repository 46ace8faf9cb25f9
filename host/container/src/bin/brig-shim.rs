//! `brig-shim`: the per-container helper the node starts. Not for direct use; see
//! `brig_container::shim`.
#![forbid(unsafe_code)]

fn main() {
    // `--spawner`: the node's one helper that starts shims (see brig_container::shim::spawner).
    let spawner = std::env::args().nth(1).as_deref() == Some("--spawner");
    let result =
        if spawner { brig_container::shim::spawner::run() } else { brig_container::shim::run() };
    if let Err(e) = result {
        eprintln!("brig-shim: {}", brig_container::shim::describe(&e));
        std::process::exit(1);
    }
}
