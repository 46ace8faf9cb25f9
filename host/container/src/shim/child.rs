//! A process started in the container on the node's request: runs in the shim's child after
//! fork, then execs. On any failure it prints why to its stderr and exits with
//! [`EXIT_BAD_SETUP`] or [`EXIT_CANNOT_EXEC`], like a shell would.

use std::ffi::CString;
use std::os::fd::OwnedFd;

use nix::sys::signal::{SigSet, Signal};

use crate::shim_proto::{SpawnSpec, EXIT_BAD_SETUP, EXIT_CANNOT_EXEC};

/// Default PATH when the request sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn fail(code: i32, message: &str) -> ! {
    let _ = nix::unistd::write(std::io::stderr(), format!("brig: {message}\n").as_bytes());
    std::process::exit(code)
}

/// Sets up and execs. `fds`: stdin, stdout, stderr, extras, then cgroup.procs files.
pub fn run(spec: &SpawnSpec, fds: Vec<OwnedFd>) -> ! {
    let extra = usize::from(spec.extra_fds);
    let cgroups = usize::from(spec.cgroup_fds);
    if fds.len() != 3 + extra + cgroups {
        fail(EXIT_BAD_SETUP, "wrong number of descriptors in spawn request");
    }
    // Join the exec's cgroup first, so everything it becomes is counted and can be killed.
    for fd in &fds[3 + extra..] {
        if let Err(e) = nix::unistd::write(fd, b"0") {
            fail(EXIT_BAD_SETUP, &format!("cannot join cgroup: {e}"));
        }
    }
    let _ = nix::unistd::setsid();
    if spec.terminal {
        // Without it the shell runs, but with no job control and no ^C.
        if let Err(e) = rustix::process::ioctl_tiocsctty(&fds[0]) {
            fail(EXIT_BAD_SETUP, &format!("cannot take the terminal: {e}"));
        }
    }
    // From here descriptors are raw numbers: install_fds closes everything it does not install.
    let raw: Vec<std::os::fd::RawFd> =
        fds.into_iter().map(std::os::fd::IntoRawFd::into_raw_fd).collect();
    if let Err(e) = super::sys::install_fds(&raw[..3 + extra]) {
        fail(EXIT_BAD_SETUP, &format!("cannot install descriptors: {e}"));
    }
    restore_signals();
    let user = match super::users::resolve(spec.user.as_deref()) {
        Ok(u) => u,
        Err(message) => fail(EXIT_BAD_SETUP, &message),
    };
    if let Err(e) = nix::unistd::chdir(spec.cwd.as_str()) {
        fail(EXIT_BAD_SETUP, &format!("cannot enter working directory {}: {e}", spec.cwd));
    }
    if let Err(e) = nix::unistd::setgroups(&user.groups) {
        fail(EXIT_BAD_SETUP, &format!("setgroups: {e}"));
    }
    if let Err(e) = nix::unistd::setresgid(user.gid, user.gid, user.gid) {
        fail(EXIT_BAD_SETUP, &format!("setgid {}: {e}", user.gid));
    }
    if let Err(e) = nix::unistd::setresuid(user.uid, user.uid, user.uid) {
        fail(EXIT_BAD_SETUP, &format!("setuid {}: {e}", user.uid));
    }
    // The shim confined itself (bounding set, no_new_privs, seccomp, no core dumps) before it
    // started serving, so this process inherited all of it; exec leaves a root process exactly
    // the bounding set's capabilities, a non-root one none.
    exec(spec, &user)
}

fn restore_signals() {
    let _ = SigSet::all().thread_unblock();
    for sig in [Signal::SIGPIPE, Signal::SIGCHLD, Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        super::sys::default_signal(sig);
    }
}

fn exec(spec: &SpawnSpec, user: &super::users::User) -> ! {
    let Some(program) = spec.argv.first() else { fail(EXIT_CANNOT_EXEC, "empty command") };
    let mut env: Vec<(String, String)> = spec.env.clone();
    for (key, value) in [
        ("PATH", DEFAULT_PATH.to_string()),
        ("HOME", user.home.clone()),
        ("USER", user.name.clone()),
        ("LOGNAME", user.name.clone()),
    ] {
        if !env.iter().any(|(k, _)| k == key) {
            env.push((key.to_string(), value));
        }
    }
    let cstr = |s: &str| {
        CString::new(s)
            .unwrap_or_else(|_| fail(EXIT_CANNOT_EXEC, "NUL byte in command or environment"))
    };
    let argv: Vec<CString> = spec.argv.iter().map(|a| cstr(a)).collect();
    let envp: Vec<CString> = env.iter().map(|(k, v)| cstr(&format!("{k}={v}"))).collect();
    let path = env.iter().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    let candidates: Vec<String> = if program.contains('/') {
        vec![program.clone()]
    } else {
        path.split(':').filter(|d| !d.is_empty()).map(|d| format!("{d}/{program}")).collect()
    };
    let mut last = nix::Error::ENOENT;
    for candidate in candidates {
        let c = cstr(&candidate);
        let Err(e) = nix::unistd::execve(&c, &argv, &envp);
        if e != nix::Error::ENOENT && e != nix::Error::ENOTDIR {
            last = e;
        }
    }
    let code = if last == nix::Error::ENOENT { EXIT_CANNOT_EXEC } else { EXIT_BAD_SETUP };
    fail(code, &format!("{program}: {}", last.desc()))
}
