//! `jq`: query JSON with a JSONPath expression (RFC 9535).
//!
//! Input: `{"query":"$.items[?@.price < 10].name","json":{...}}` or with `"path":"data.json"`
//! naming a workspace file instead of inline `json`. Output: `{"results":[...]}`.

use brig_tool_common::{parse_input, to_output, workspace_path};
use serde::Deserialize;
use serde_json::Value;
use serde_json_path::JsonPath;

wit_bindgen::generate!({ world: "tool-component", path: "../../wit" });

use exports::brig::tool::tool::{Guest, Info};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    query: String,
    json: Option<Value>,
    path: Option<String>,
}

struct Jq;

impl Guest for Jq {
    fn describe() -> Info {
        Info {
            name: "jq".into(),
            description: "Query inline JSON or a workspace JSON file with JSONPath".into(),
            input_schema: r#"{"type":"object","required":["query"],"properties":{"query":{"type":"string"},"json":{},"path":{"type":"string"}}}"#.into(),
        }
    }

    fn call(input: String) -> Result<String, String> {
        let input: Input = parse_input(&input)?;
        let query = JsonPath::parse(&input.query).map_err(|e| format!("bad query: {e}"))?;
        let doc = match (input.json, input.path) {
            (Some(v), None) => v,
            (None, Some(p)) => {
                let text = std::fs::read_to_string(workspace_path(&p)?)
                    .map_err(|e| format!("{p}: {e}"))?;
                serde_json::from_str(&text).map_err(|e| format!("{p}: not JSON: {e}"))?
            }
            _ => return Err("give exactly one of `json` or `path`".into()),
        };
        let results: Vec<&Value> = query.query(&doc).all();
        to_output(&serde_json::json!({ "results": results }))
    }
}

export!(Jq);
