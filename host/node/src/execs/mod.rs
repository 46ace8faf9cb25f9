//! A sandbox's commands as the node keeps them: running and finished ones with their output
//! for whoever attaches (`hub`), the input written to them (`input`), and finished output read
//! back from where a tier keeps it (`archive`).

pub(crate) mod archive;
pub(crate) mod hub;
pub(crate) mod input;
