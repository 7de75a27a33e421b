//! The worker's request and outcome lines: the daemon's own `eval` bodies.

pub use airlock_api::v1::{
    EvalError, EvalErrorKind, EvalLanguage as Language, EvalRequest, EvalResponse as EvalOutcome,
};
