//! Brig's layer store.
#![deny(unsafe_code)]

pub mod build;
pub mod erofs;
pub mod layout;
