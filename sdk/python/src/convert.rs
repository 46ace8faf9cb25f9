//! Python values in and out: Brig records as plain dicts (from their serde form), durations
//! as seconds or `timedelta`, create options from keyword arguments.

use std::time::Duration;

use brig_sdk::{Placement, QosClass, SandboxInfo, SandboxOptions, Tier};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyNone, PyString};

/// A serde value that becomes the matching Python object (dict, list, str, int, float, bool,
/// None) when handed to Python.
pub(crate) struct Json {
    value: serde_json::Value,
    /// The `brig.records` class it becomes (each item of a list does), or a plain dict.
    record: Option<&'static str>,
}

fn to_value<T: serde::Serialize>(value: &T) -> PyResult<serde_json::Value> {
    serde_json::to_value(value)
        .map_err(|e| PyValueError::new_err(format!("record conversion: {e}")))
}

impl Json {
    /// Plain data (dicts and lists).
    pub(crate) fn of<T: serde::Serialize>(value: &T) -> PyResult<Json> {
        Ok(Json { value: to_value(value)?, record: None })
    }

    /// A `brig.records.<class>` (a list of them for a list).
    pub(crate) fn record<T: serde::Serialize>(class: &'static str, value: &T) -> PyResult<Json> {
        Ok(Json { value: to_value(value)?, record: Some(class) })
    }

    /// A sandbox's record, with its labels as a dict.
    pub(crate) fn sandbox(info: &SandboxInfo) -> PyResult<Json> {
        let mut value = to_value(info)?;
        let labels: serde_json::Map<String, serde_json::Value> = info
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        value["labels"] = serde_json::Value::Object(labels);
        Ok(Json { value, record: Some("SandboxInfo") })
    }
}

static RECORDS: pyo3::sync::PyOnceLock<Py<PyModule>> = pyo3::sync::PyOnceLock::new();

/// `brig.records.<class>._from_dict`.
fn record_class<'py>(py: Python<'py>, class: &str) -> PyResult<Bound<'py, PyAny>> {
    let module = RECORDS.get_or_try_init(py, || py.import("brig.records").map(Bound::unbind))?;
    module.bind(py).getattr(class)?.getattr("_from_dict")
}

fn to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match value {
        Value::Null => PyNone::get(py).to_owned().into_any(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let items = items.iter().map(|v| to_py(py, v)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

impl<'py> IntoPyObject<'py> for Json {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let plain = to_py(py, &self.value)?;
        let Some(class) = self.record else { return Ok(plain) };
        let make = record_class(py, class)?;
        match plain.cast::<PyList>() {
            Ok(list) => {
                let items =
                    list.iter().map(|item| make.call1((item,))).collect::<PyResult<Vec<_>>>()?;
                Ok(PyList::new(py, items)?.into_any())
            }
            Err(_) => make.call1((plain,)),
        }
    }
}

/// Seconds (int or float) or a `datetime.timedelta`.
pub(crate) fn duration(value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    if let Ok(seconds) = value.extract::<f64>() {
        return Duration::try_from_secs_f64(seconds)
            .map_err(|e| PyValueError::new_err(format!("{seconds} s is not a duration: {e}")));
    }
    value.extract::<Duration>()
}

pub(crate) fn tier(name: &str) -> PyResult<Tier> {
    Ok(match name {
        "fncall" => Tier::Fncall,
        "container" => Tier::Container,
        "microvm" => Tier::Microvm,
        "fullvm" => Tier::Fullvm,
        other => {
            return Err(PyValueError::new_err(format!(
                "no tier {other:?} (fncall, container, microvm, fullvm)"
            )))
        }
    })
}

/// `SandboxOptions` from `create`'s keyword arguments; an unknown keyword is a `TypeError`.
pub(crate) fn options(
    tier_name: &str,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<SandboxOptions> {
    let mut options = SandboxOptions::tier(tier(tier_name)?);
    let Some(kwargs) = kwargs else { return Ok(options) };
    for (key, value) in kwargs.iter() {
        let key: String = key.extract()?;
        if value.is_none() {
            continue;
        }
        options = match key.as_str() {
            "image" => options.image(&value.extract::<String>()?),
            "memory_mib" => options.memory_mib(value.extract()?),
            "cpu_millis" => options.cpu_millis(value.extract()?),
            "pids" => options.pids(value.extract()?),
            "disk_mib" => options.disk_mib(value.extract()?),
            "labels" => {
                for (k, v) in value.extract::<Vec<(String, String)>>().or_else(|_| {
                    value
                        .cast::<PyDict>()?
                        .iter()
                        .map(|(k, v)| Ok((k.extract()?, v.extract()?)))
                        .collect::<PyResult<Vec<_>>>()
                })? {
                    options = options.label(&k, &v);
                }
                options
            }
            "env" => {
                for (k, v) in value.extract::<std::collections::BTreeMap<String, String>>()? {
                    options = options.env(&k, &v);
                }
                options
            }
            "idle_ttl" => options.idle_ttl(duration(&value)?),
            "pause_when_idle" => {
                if value.extract::<bool>()? {
                    options.pause_when_idle()
                } else {
                    options
                }
            }
            "paused_ttl" => options.paused_ttl(duration(&value)?),
            "max_lifetime" => options.max_lifetime(duration(&value)?),
            "egress" => options.egress(value.extract::<Vec<String>>()?),
            "qos" => options.qos(qos(&value.extract::<String>()?)?),
            "placement" => options.placement(match value.extract::<String>()?.as_str() {
                "host_kernel" => Placement::HostKernel,
                "vm" => Placement::Vm,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "no placement {other:?} (host_kernel, vm)"
                    )))
                }
            }),
            "read_only_paths" => {
                for path in value.extract::<Vec<String>>()? {
                    options = options.read_only_path(&path);
                }
                options
            }
            "hidden_paths" => {
                for path in value.extract::<Vec<String>>()? {
                    options = options.hidden_path(&path);
                }
                options
            }
            // {path: volume} or {path: (volume, read_only)}.
            "volumes" => {
                for (path, v) in value.cast::<PyDict>()?.iter() {
                    let path: String = path.extract()?;
                    let (volume, read_only) = match v.extract::<(String, bool)>() {
                        Ok(pair) => pair,
                        Err(_) => (v.extract::<String>()?, false),
                    };
                    options = options.volume(&volume, &path, read_only);
                }
                options
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "create() got an unexpected keyword {other:?}"
                )))
            }
        };
    }
    Ok(options)
}

pub(crate) fn qos(name: &str) -> PyResult<QosClass> {
    match name {
        "latency_sensitive" => Ok(QosClass::LatencySensitive),
        "best_effort" => Ok(QosClass::BestEffort),
        other => {
            Err(PyValueError::new_err(format!("no qos {other:?} (latency_sensitive, best_effort)")))
        }
    }
}

/// A label selector from a dict.
pub(crate) fn selector(labels: &Bound<'_, PyDict>) -> PyResult<Vec<(String, String)>> {
    labels.iter().map(|(k, v)| Ok((k.extract()?, v.extract()?))).collect()
}

pub(crate) fn as_refs(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// A build event as a flat dict: `step`, `steps`, `type` (`started`, `log`, `finished`) and
/// its fields.
pub(crate) fn build_event(e: &brig_sdk::BuildEvent) -> Json {
    use brig_sdk::BuildEventKind as K;
    let mut v = serde_json::json!({ "step": e.step, "steps": e.steps });
    match &e.kind {
        K::Started { text, cached } => {
            v["type"] = "started".into();
            v["text"] = text.clone().into();
            v["cached"] = (*cached).into();
        }
        K::Log { stream, text } => {
            v["type"] = "log".into();
            v["stream"] = format!("{stream:?}").to_lowercase().into();
            v["text"] = text.clone().into();
        }
        K::Finished { millis } => {
            v["type"] = "finished".into();
            v["millis"] = (*millis).into();
        }
    }
    Json { value: v, record: None }
}
