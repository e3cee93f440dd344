//! The one error of parsing and validation: what was wrong with a request, for its caller.

use thiserror::Error;

/// A request that is malformed or names impossible values. `code` is stable and snake_case, for
/// programs to branch on; `message` is for people.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct Invalid {
    pub code: &'static str,
    pub message: String,
}

impl Invalid {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}
