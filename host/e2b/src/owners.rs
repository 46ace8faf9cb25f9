//! Owner and group names of a sandbox's files, as envd reports them: the names the sandbox's
//! own `/etc/passwd` and `/etc/group` give the numeric ids (the id itself where they give
//! none). Both files are read through Brig with a byte cap and kept a few seconds per sandbox.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_sdk::Sandbox;

/// How long a sandbox's names are used before its files are read again.
const FRESH: Duration = Duration::from_secs(5);
/// Most sandboxes whose names are kept (the stalest go first).
const MAX_SANDBOXES: usize = 4096;
/// Most bytes of `/etc/passwd` or `/etc/group` read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// One sandbox's user and group names by id.
#[derive(Debug, Default)]
pub(crate) struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    /// From the texts of `/etc/passwd` and `/etc/group` (`name:x:id:…` lines; the first
    /// name of an id wins, as `getpwuid` finds it).
    pub(crate) fn parse(passwd: &str, group: &str) -> Names {
        Names { users: ids(passwd), groups: ids(group) }
    }

    pub(crate) fn owner(&self, uid: u32) -> String {
        self.users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }

    pub(crate) fn group(&self, gid: u32) -> String {
        self.groups.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }
}

fn ids(text: &str) -> HashMap<u32, String> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut fields = line.split(':');
        let (Some(name), Some(_), Some(id)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if let Ok(id) = id.trim().parse::<u32>() {
            if !name.is_empty() {
                out.entry(id).or_insert_with(|| name.to_string());
            }
        }
    }
    out
}

/// Every sandbox's names, read on first use and again when stale.
#[derive(Default)]
pub(crate) struct OwnerNames {
    kept: parking_lot::Mutex<HashMap<String, (Instant, Arc<Names>)>>,
}

impl OwnerNames {
    /// `sb`'s names (none, so ids as numbers, where its files cannot be read).
    pub(crate) async fn of(&self, sb: &Sandbox) -> Arc<Names> {
        if let Some((at, names)) = self.kept.lock().get(sb.id()) {
            if at.elapsed() < FRESH {
                return names.clone();
            }
        }
        let read = |path: &'static str| async move {
            let bytes = sb.read_file_head(path, MAX_FILE_BYTES).await.unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let (passwd, group) = tokio::join!(read("/etc/passwd"), read("/etc/group"));
        let names = Arc::new(Names::parse(&passwd, &group));
        let mut kept = self.kept.lock();
        if kept.len() >= MAX_SANDBOXES {
            let stalest = kept.iter().min_by_key(|(_, (at, _))| *at).map(|(id, _)| id.clone());
            if let Some(id) = stalest {
                kept.remove(&id);
            }
        }
        kept.insert(sb.id().to_string(), (Instant::now(), names.clone()));
        names
    }

    pub(crate) fn forget(&self, sandbox: &str) {
        self.kept.lock().remove(sandbox);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_become_names_and_unknown_ids_stay_numbers() {
        let names = Names::parse(
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\nbad line\n",
            "root:x:0:\nusers:x:100:\nuser:x:1000:\n",
        );
        assert_eq!((names.owner(0), names.group(0)), ("root".into(), "root".into()));
        assert_eq!((names.owner(1000), names.group(100)), ("user".into(), "users".into()));
        assert_eq!((names.owner(4242), names.group(7)), ("4242".into(), "7".into()));
    }
}
