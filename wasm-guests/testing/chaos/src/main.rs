//! `chaos`: a `wasi:cli/run` command that misbehaves on request, for the hostile-guest tests.
//!
//! Usage: `chaos <mode> [arg]` where mode is one of
//! `echo <text>` (prints text), `cat` (copies stdin to stdout), `env <NAME>`,
//! `loop` (spins forever), `alloc <mib>` (allocates and touches memory until done or dead),
//! `flood` (writes to stdout forever), `read <path>` (prints a file), `write <path> <text>`,
//! `connect <host:port>` (opens a TCP connection), `exit <code>`, `panic`.

use std::io::{Read, Write};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("echo");
    let arg = args.get(2).cloned().unwrap_or_default();
    match mode {
        "echo" => println!("{}", args[2..].join(" ")),
        "cat" => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).expect("read stdin");
            std::io::stdout().write_all(&buf).expect("write stdout");
        }
        "env" => println!("{}", std::env::var(&arg).unwrap_or_default()),
        "loop" => {
            let mut x: u64 = 1;
            loop {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        "alloc" => {
            let mib: usize = arg.parse().unwrap_or(usize::MAX >> 21);
            let mut chunks = Vec::new();
            for _ in 0..mib {
                let mut v = vec![0u8; 1 << 20];
                v[4096] = 1;
                chunks.push(v);
            }
            println!("allocated {} MiB", chunks.len());
        }
        "flood" => {
            let line = [b'y'; 4096];
            let mut out = std::io::stdout().lock();
            loop {
                if out.write_all(&line).is_err() {
                    std::process::exit(3);
                }
            }
        }
        "read" => match std::fs::read_to_string(&arg) {
            Ok(s) => print!("{s}"),
            Err(e) => {
                eprintln!("read {arg}: {e}");
                std::process::exit(1);
            }
        },
        "write" => {
            let text = args.get(3).cloned().unwrap_or_default();
            if let Err(e) = std::fs::write(&arg, text) {
                eprintln!("write {arg}: {e}");
                std::process::exit(1);
            }
        }
        "connect" => match std::net::TcpStream::connect(&arg) {
            Ok(_) => println!("connected to {arg}"),
            Err(e) => {
                eprintln!("connect {arg}: {e}");
                std::process::exit(1);
            }
        },
        "exit" => std::process::exit(arg.parse().unwrap_or(1)),
        "panic" => panic!("chaos asked to panic"),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
}
