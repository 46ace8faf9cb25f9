//! E2B's code-interpreter template (`code-interpreter-v1`, the default of the
//! `e2b-code-interpreter` package): built by Brig's builder the first time a create asks for
//! it, from the Dockerfile and server in `host/e2b/templates/code-interpreter` (Debian's
//! Jupyter kernel packages and our server for the package's HTTP contract on port 49999),
//! then kept as a template like any other. A change to either file builds it again (the
//! step cache keeps what did not change).

use axum::http::StatusCode;
use brig_sdk::{BuildOptions, Client};
use sha2::Digest;

use crate::api::{unix_ms, ApiError};
use crate::templates::{BuildRecord, Resolved, Template, DEFAULT_TAG};
use crate::Gateway;

/// The template's id, and the other name E2B's code knows it by.
pub(crate) const TEMPLATE_ID: &str = "code-interpreter-v1";
const ALSO_NAMED: &str = "code-interpreter";
const DOCKERFILE: &str = include_str!("../templates/code-interpreter/Dockerfile");
const SERVER: &str = include_str!("../templates/code-interpreter/server.py");
const START: &str = "python3 /opt/brig/code-interpreter/server.py --port 49999";
const READY: &str = "python3 -c \"import urllib.request; \
    urllib.request.urlopen('http://127.0.0.1:49999/health', timeout=2)\"";

/// Whether a create names the code-interpreter template.
pub(crate) fn is_code_interpreter(template: &str) -> bool {
    let (name, _) = crate::templates::split_tag(template);
    name == TEMPLATE_ID || name == ALSO_NAMED
}

/// The tag of the build made from this gateway's files.
fn files_tag() -> String {
    let mut hasher = sha2::Sha256::new();
    hasher.update(DOCKERFILE);
    hasher.update(SERVER);
    format!("brig-{}", &hex::encode(hasher.finalize())[..12])
}

/// The template's build from this gateway's files, built now if there is none.
pub(crate) async fn ensure(gw: &Gateway, client: &Client) -> Result<Resolved, ApiError> {
    let tagged = format!("{TEMPLATE_ID}:{}", files_tag());
    if let Some(found) = gw.inner.templates.resolve(&tagged) {
        return Ok(found);
    }
    // One build at a time; the creates that waited find it.
    let _turn = gw.inner.code_interpreter_build.lock().await;
    if let Some(found) = gw.inner.templates.resolve(&tagged) {
        return Ok(found);
    }
    tracing::info!("building the code-interpreter template");
    let failed = |what: String| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("code-interpreter template: {what}"),
        )
    };
    let context = gw.inner.templates.files.join(format!("context-{}", crate::templates::new_id()));
    std::fs::create_dir_all(&context).map_err(|e| failed(e.to_string()))?;
    std::fs::write(context.join("server.py"), SERVER).map_err(|e| failed(e.to_string()))?;
    let base = gw.config().templates.get("base").cloned().unwrap_or_else(|| "debian-12".into());
    let build_id = crate::templates::new_build_id();
    let env = format!("e2b/{TEMPLATE_ID}/{}", build_id.replace('-', ""));
    let options =
        BuildOptions::dockerfile(&env, DOCKERFILE).context(&context).build_arg("BASE", &base);
    let built = client.build_image(options, |_| {}).await;
    let _ = std::fs::remove_dir_all(&context);
    let built = built.map_err(|e| failed(crate::envd::brig_message(&e)))?;
    let record = BuildRecord {
        image: format!("env:{}", built.name),
        start_cmd: Some(START.into()),
        ready_cmd: Some(READY.into()),
        workdir: built.working_dir.clone(),
        finished_ms: unix_ms(),
    };
    gw.inner.templates.change(|all| {
        let t = all.entry(TEMPLATE_ID.to_string()).or_insert_with(|| Template {
            names: vec![ALSO_NAMED.to_string()],
            created_ms: unix_ms(),
            ..Default::default()
        });
        t.builds.insert(build_id.clone(), record.clone());
        t.tags.insert(DEFAULT_TAG.to_string(), build_id.clone());
        t.tags.insert(files_tag(), build_id.clone());
    });
    Ok(Resolved { build: record, project: None })
}
