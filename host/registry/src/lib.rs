//! Brig's registry pulls: an image of any OCI distribution registry becomes an environment of
//! Brig layers, one per image layer, each converted once (`pull`), with OCI whiteouts turned
//! into overlay ones (`unpack`).

pub mod progress;
pub mod pull;
pub mod unpack;

pub use progress::{LayerState, LayerStatus, Progress, PullStatus};
pub use pull::{
    default_name, layer_name, pull, ImageConfig, PullConfig, PullError, Pulled, PulledLayer,
};
