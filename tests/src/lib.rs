//! brig-tests
