//! What a connection may do on this node. The all-in-one daemon's clients and the control
//! plane are admins; a client holding a node token the control plane signed for its project
//! reaches only that project's sandboxes (and its sub-projects').
//!
//! A sandbox's project is its `brig.project` label, set at create from the request the control
//! plane forwards and inherited by forks; clients cannot set or change it.

use brig_proto::{ImageOp, NodeOp, Request, SandboxOp, Target, ToolOp, VolumeOp};

use crate::{Node, NodeError};

/// The label that names a sandbox's project.
pub const PROJECT_LABEL: &str = "brig.project";

/// Who a connection acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Project(String),
}

fn in_project(labels: &[(String, String)], project: &str) -> bool {
    labels
        .iter()
        .any(|(k, v)| k == PROJECT_LABEL && (v == project || v.starts_with(&format!("{project}/"))))
}

fn strip_project(labels: &mut Vec<(String, String)>) {
    labels.retain(|(k, _)| k != PROJECT_LABEL);
}

fn scope_selector(labels: &mut Vec<(String, String)>, project: &str) {
    strip_project(labels);
    labels.push((PROJECT_LABEL.to_string(), project.to_string()));
}

impl Node {
    /// Checks `request` against `principal`, rewriting what must be scoped (selectors get the
    /// project label, creates get their project). A sandbox outside the project is reported as
    /// not found, so its existence does not leak.
    pub(crate) fn authorize(
        &self,
        principal: &Principal,
        mut request: Request,
    ) -> Result<Request, NodeError> {
        use Request as R;
        if let R::Control(op) = &request {
            return Err(NodeError::ControlOnly(op.kind()));
        }
        let Principal::Project(project) = principal else {
            // Admin: a create the control plane forwards carries its project.
            match &mut request {
                R::Sandbox(SandboxOp::Create(req)) => {
                    if let Some(p) = req.project.take() {
                        scope_selector(&mut req.labels, &p);
                    }
                }
                R::Sandbox(SandboxOp::List(req)) => {
                    if let Some(p) = req.project.take() {
                        scope_selector(&mut req.labels, &p);
                    }
                }
                _ => {}
            }
            return Ok(request);
        };
        if let Some(sandbox) = request.sandbox() {
            if let Ok(entry) = self.inner.sandboxes.get(sandbox) {
                if !in_project(&entry.spec().labels, project) {
                    return Err(NodeError::SandboxNotFound(sandbox.to_string()));
                }
            }
        }
        match &mut request {
            R::Volume(VolumeOp::Create(req)) => req.project = Some(project.clone()),
            R::Volume(VolumeOp::List { project: listed }) => *listed = Some(project.clone()),
            // A name is the project's volume of that name; an id must be the project's.
            R::Volume(op) => {
                if let Some(volume) = op.volume_mut() {
                    let found = self.inner.volumes.find(volume, Some(project))?;
                    *volume = found.record.id.clone();
                }
            }
            R::Sandbox(SandboxOp::Create(_)) => {
                return Err(NodeError::Forbidden(
                    "create sandboxes through the control plane, which places them".into(),
                ))
            }
            R::Sandbox(SandboxOp::List(req)) => {
                req.project = None;
                scope_selector(&mut req.labels, project);
            }
            R::Sandbox(SandboxOp::DestroyMatching { labels })
            | R::Sandbox(SandboxOp::Pause(Target::Labels(labels)))
            | R::Sandbox(SandboxOp::PauseFilesOnly(Target::Labels(labels)))
            | R::Sandbox(SandboxOp::Resume(Target::Labels(labels))) => {
                scope_selector(labels, project)
            }
            R::Sandbox(SandboxOp::Fork { labels, .. }) => strip_project(labels),
            R::Sandbox(SandboxOp::Events(req)) => req.project = Some(project.clone()),
            R::Tool(ToolOp::Add { .. })
            | R::Tool(ToolOp::Remove { .. })
            | R::Image(ImageOp::Import(_))
            | R::Image(ImageOp::Tag { .. })
            | R::Image(ImageOp::Remove { .. })
            | R::Image(ImageOp::Gc)
            | R::Image(ImageOp::CacheDrop)
            | R::Image(ImageOp::Verify { .. })
            | R::Image(ImageOp::EnvCreate { .. })
            | R::Node(NodeOp::Doctor { .. }) => {
                return Err(NodeError::Forbidden(format!(
                    "{} changes the node for everyone and needs an admin token",
                    request.kind()
                )))
            }
            _ => {}
        }
        Ok(request)
    }

    /// This node's id.
    pub fn node_id(&self) -> u32 {
        self.inner.config.node_id
    }

    /// Images this node can serve, for placement: `None` when it reads the shared layer store
    /// (any image), else its local images.
    pub fn image_access(&self) -> Option<Vec<String>> {
        if self.inner.store.is_ok() {
            return None;
        }
        Some(self.container_tier().map(|c| c.local_images()).unwrap_or_default())
    }

    /// Live sandboxes per project, for heartbeats.
    pub fn live_by_project(&self) -> Vec<(String, u64)> {
        let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
        for entry in self.inner.sandboxes.all() {
            let spec = entry.spec();
            if let Some((_, p)) = spec.labels.iter().find(|(k, _)| k == PROJECT_LABEL) {
                *counts.entry(p.clone()).or_default() += 1;
            }
        }
        counts.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_membership_includes_sub_projects_only() {
        let labels = vec![(PROJECT_LABEL.to_string(), "team/a".to_string())];
        assert!(in_project(&labels, "team/a"));
        assert!(in_project(&labels, "team"));
        assert!(!in_project(&labels, "team/ab"));
        assert!(!in_project(&labels, "tea"));
        assert!(!in_project(&[], "team"));
    }
}
