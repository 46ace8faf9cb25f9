//! What a container's commands start with when their request names nothing else: its image's
//! variables (the request's on top), directory, user and command.

/// What a container's commands start with when a request names nothing else: its image's
/// variables (under the request's), directory, user and command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessDefaults {
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub user: Option<String>,
    pub command: Vec<String>,
}

impl ProcessDefaults {
    /// The directory a command starts in: `asked`, else the image's (empty is `/`).
    pub(crate) fn cwd(&self, asked: Option<String>) -> String {
        asked.filter(|c| !c.is_empty()).or_else(|| self.cwd.clone()).unwrap_or_default()
    }

    pub(crate) fn user(&self, asked: Option<String>) -> Option<String> {
        asked.or_else(|| self.user.clone())
    }
}

/// `base` with `extra` on top (a name in both takes `extra`'s value).
pub fn merged_env(
    base: &[(String, String)],
    extra: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        base.iter().filter(|(k, _)| !extra.iter().any(|(e, _)| e == k)).cloned().collect();
    env.extend(extra);
    env
}
