//! A process started in the container on the node's request, prepared by the shim. Everything
//! that allocates or reads files (the user lookup, argv and the environment as C strings, the
//! PATH candidates, the text of a setup error) is done here, in the shim; the child that
//! [`super::spawn`] starts only makes system calls on the result, then execs. On a failure it
//! prints why to its stderr and exits with [`EXIT_BAD_SETUP`] or [`EXIT_CANNOT_EXEC`], like a
//! shell would.

use std::ffi::{c_char, CString};
use std::os::fd::OwnedFd;

use crate::shim_proto::{SpawnSpec, EXIT_BAD_SETUP, EXIT_CANNOT_EXEC};

/// Default PATH when the request sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A setup error found while preparing, reported by the child (exit code and message).
pub struct Failure {
    pub code: i32,
    pub message: String,
    /// The request itself is malformed: reported before the child joins its cgroups or
    /// installs its descriptors (so on the shim's stderr, /dev/null). Otherwise it is reported
    /// on the command's stderr once that is installed.
    pub early: bool,
}

/// What the child needs, ready to use without allocating.
pub struct Prepared {
    /// stdin, stdout, stderr, then the extra descriptors: installed as 0, 1, 2, 3, ...
    pub stdio: Vec<OwnedFd>,
    /// The cgroup.procs files the child joins first.
    pub cgroups: Vec<OwnedFd>,
    pub terminal: bool,
    pub failure: Option<Failure>,
    pub cwd: CString,
    pub cwd_text: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    pub program: String,
    /// The paths to try, in order (the program itself when it has a `/`, else PATH's).
    pub candidates: Vec<CString>,
    /// NULL-terminated pointers into `_argv` and `_envp`, which own the strings.
    pub argv: Vec<*const c_char>,
    pub envp: Vec<*const c_char>,
    _argv: Vec<CString>,
    _envp: Vec<CString>,
}

/// Prepares `spec`. `fds`: stdin, stdout, stderr, extras, then cgroup.procs files.
pub fn prepare(spec: &SpawnSpec, mut fds: Vec<OwnedFd>) -> Prepared {
    let extra = usize::from(spec.extra_fds);
    let mut prepared = Prepared {
        stdio: Vec::new(),
        cgroups: Vec::new(),
        terminal: spec.terminal,
        failure: None,
        cwd: CString::default(),
        cwd_text: spec.cwd.clone(),
        uid: 0,
        gid: 0,
        groups: Vec::new(),
        program: spec.argv.first().cloned().unwrap_or_default(),
        candidates: Vec::new(),
        argv: vec![std::ptr::null()],
        envp: vec![std::ptr::null()],
        _argv: Vec::new(),
        _envp: Vec::new(),
    };
    if fds.len() != 3 + extra + usize::from(spec.cgroup_fds) {
        prepared.failure = Some(Failure {
            code: EXIT_BAD_SETUP,
            message: "wrong number of descriptors in spawn request".into(),
            early: true,
        });
        return prepared;
    }
    prepared.cgroups = fds.split_off(3 + extra);
    prepared.stdio = fds;
    let late = |code: i32, message: String| Some(Failure { code, message, early: false });
    let user = match super::users::resolve(spec.user.as_deref()) {
        Ok(u) => u,
        Err(message) => {
            prepared.failure = late(EXIT_BAD_SETUP, message);
            return prepared;
        }
    };
    prepared.uid = user.uid.as_raw();
    prepared.gid = user.gid.as_raw();
    prepared.groups = user.groups.iter().map(|g| g.as_raw()).collect();
    let Ok(cwd) = CString::new(spec.cwd.as_str()) else {
        prepared.failure =
            late(EXIT_BAD_SETUP, format!("NUL byte in working directory {:?}", spec.cwd));
        return prepared;
    };
    prepared.cwd = cwd;
    if spec.argv.is_empty() {
        prepared.failure = late(EXIT_CANNOT_EXEC, "empty command".into());
        return prepared;
    }
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
    let path = env.iter().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    let candidates: Vec<String> = if prepared.program.contains('/') {
        vec![prepared.program.clone()]
    } else {
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| format!("{d}/{}", prepared.program))
            .collect()
    };
    let strings = |texts: &mut dyn Iterator<Item = String>| -> Option<Vec<CString>> {
        texts.map(|t| CString::new(t).ok()).collect()
    };
    let (Some(argv), Some(envp), Some(candidates)) = (
        strings(&mut spec.argv.iter().cloned()),
        strings(&mut env.iter().map(|(k, v)| format!("{k}={v}"))),
        strings(&mut candidates.into_iter()),
    ) else {
        prepared.failure = late(EXIT_CANNOT_EXEC, "NUL byte in command or environment".into());
        return prepared;
    };
    prepared.argv = argv.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect();
    prepared.envp = envp.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect();
    // Moving the vectors keeps each string's heap buffer where the pointers point.
    prepared._argv = argv;
    prepared._envp = envp;
    prepared.candidates = candidates;
    prepared
}
