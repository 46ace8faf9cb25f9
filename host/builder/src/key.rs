//! Cache keys of build steps. A step's key hashes its parent's key, the step itself, the
//! config it runs with (variables, directory, user: a RUN under another `ENV` is another
//! step) and its inputs' hashes (a COPY's files), so a key names one result: an unchanged
//! rebuild finds every layer by key and runs nothing, and a change re-runs that step and
//! those after it.

use sha2::{Digest, Sha256};

use crate::step::{ImageConfig, Step};

/// A step's cache key: 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StepKey(pub String);

/// The version of how keys are made: a change to what a step does bumps it, so no old cache
/// entry is taken for a new kind of result.
const KEY_VERSION: &str = "brig-build-1";

impl StepKey {
    /// The key of a build's base: the layers it starts from (their digests, bottom first).
    pub fn base(layer_digests: &[String]) -> StepKey {
        let mut hasher = Sha256::new();
        hasher.update(KEY_VERSION);
        for digest in layer_digests {
            hasher.update(b"\0layer\0");
            hasher.update(digest.as_bytes());
        }
        StepKey(hex::encode(hasher.finalize()))
    }

    /// The key of `step` run on top of `self` with `config` (and the RUN's build `args`);
    /// `inputs` is the hash of the files it reads (a COPY's), if any.
    pub fn then(
        &self,
        step: &Step,
        config: &ImageConfig,
        args: &[(String, String)],
        inputs: Option<&str>,
    ) -> StepKey {
        let mut hasher = Sha256::new();
        hasher.update(KEY_VERSION);
        hasher.update(self.0.as_bytes());
        hasher.update(serde_json::to_vec(step).unwrap_or_default());
        hasher.update(serde_json::to_vec(config).unwrap_or_default());
        hasher.update(serde_json::to_vec(args).unwrap_or_default());
        if let Some(inputs) = inputs {
            hasher.update(b"\0inputs\0");
            hasher.update(inputs.as_bytes());
        }
        StepKey(hex::encode(hasher.finalize()))
    }

    /// The layer name a step's result is kept under in the store (`build-cache/<key>`).
    pub fn layer_name(&self) -> String {
        format!("build-cache/{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::Command;

    #[test]
    fn a_key_changes_with_the_parent_the_step_the_config_and_the_inputs() {
        let base = StepKey::base(&["sha256:a".into()]);
        let run = Step::Run(Command::Shell("make".into()));
        let config = ImageConfig::default();
        let key = base.then(&run, &config, &[], None);
        assert_eq!(key, base.then(&run, &config, &[], None), "the same step, the same key");
        assert_eq!(key.0.len(), 64);
        let other_base = StepKey::base(&["sha256:b".into()]);
        assert_ne!(key, other_base.then(&run, &config, &[], None));
        assert_ne!(
            key,
            base.then(&Step::Run(Command::Shell("make all".into())), &config, &[], None)
        );
        let mut env = config.clone();
        env.apply(&Step::Env(vec![("CC".into(), "clang".into())]));
        assert_ne!(key, base.then(&run, &env, &[], None));
        assert_ne!(key, base.then(&run, &config, &[("V".into(), "2".into())], None));
        assert_ne!(key, base.then(&run, &config, &[], Some("files")));
        assert!(key.layer_name().starts_with("build-cache/"));
    }
}
