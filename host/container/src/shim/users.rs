//! Resolving a user name or `uid[:gid]` against the container's /etc/passwd and /etc/group.

use nix::unistd::{Gid, Uid};

pub struct User {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    pub groups: Vec<Gid>,
    pub home: String,
}

/// `None` or `root` is root. A name is looked up in /etc/passwd; `uid` or `uid:gid` are taken
/// as given (a uid missing from /etc/passwd gets HOME=/).
pub fn resolve(spec: Option<&str>) -> Result<User, String> {
    let spec = spec.unwrap_or("root");
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let entries: Vec<Vec<&str>> =
        passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).filter(|f| f.len() >= 7).collect();
    let (uid_part, gid_part) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let by_number = uid_part.parse::<u32>().ok();
    let entry = entries.iter().find(|f| match by_number {
        Some(n) => f[2].parse::<u32>().ok() == Some(n),
        None => f[0] == uid_part,
    });
    let (name, uid, mut gid, home) = match (entry, by_number) {
        (Some(f), _) => (
            f[0].to_string(),
            f[2].parse::<u32>().map_err(|_| format!("bad uid for {}", f[0]))?,
            f[3].parse::<u32>().map_err(|_| format!("bad gid for {}", f[0]))?,
            f[5].to_string(),
        ),
        (None, Some(n)) => (n.to_string(), n, n, "/".to_string()),
        (None, None) if uid_part == "root" => ("root".into(), 0, 0, "/root".into()),
        (None, None) => return Err(format!("no user {uid_part:?} in /etc/passwd")),
    };
    if let Some(g) = gid_part {
        gid = g.parse().map_err(|_| format!("bad gid {g:?}"))?;
    }
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let mut groups = vec![Gid::from_raw(gid)];
    for line in group.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 4 && f[3].split(',').any(|m| m == name) {
            if let Ok(g) = f[2].parse::<u32>() {
                if g != gid {
                    groups.push(Gid::from_raw(g));
                }
            }
        }
    }
    Ok(User { name, uid: Uid::from_raw(uid), gid: Gid::from_raw(gid), groups, home })
}
