//! Environments: image resolution against the layer store, registry pulls, builds and volumes.

pub(crate) mod build;
pub(crate) mod build_layers;
pub(crate) mod build_step;
pub(crate) mod images;
pub(crate) mod pulls;
pub mod volumes;
