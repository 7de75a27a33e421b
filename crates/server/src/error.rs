//! The one error type every handler returns, rendered as `{"code", "message"}` with the
//! code's HTTP status.

use airlock_api::v1::{ErrorBody, ErrorCode};

use crate::store::StoreError;

/// `Retry-After` (seconds) of a create refused at `--max-sandboxes`: a slot frees when any
/// sandbox ends, which the daemon cannot foresee; this paces retrying clients (the E2B SDKs
/// honour it on their 429).
pub const CAPACITY_RETRY_AFTER_SECONDS: u32 = 5;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::InvalidRequest, message)
    }

    pub fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::Unprocessable, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::Internal, message)
    }

    pub fn no_sandbox(id: &str) -> ApiError {
        ApiError::new(ErrorCode::NotFound, format!("no sandbox {id:?}"))
    }

    /// Renders an error and its whole `source()` chain on one line.
    pub fn from_chain(code: ErrorCode, err: &dyn std::error::Error) -> ApiError {
        let mut message = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        ApiError::new(code, message)
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code,
            message: self.message.clone(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> ApiError {
        ApiError::from_chain(ErrorCode::Internal, &err)
    }
}
