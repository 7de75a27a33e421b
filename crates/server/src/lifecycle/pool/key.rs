//! A pool member's request and the key a create must share with it to be served from it.

use airlock_api::v1::{CreateSandboxRequest, Lifecycle};

/// The request a member is started with: the template, nothing else.
pub(super) fn bare_request(template: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: Some(template.to_owned()),
        ..CreateSandboxRequest::default()
    }
}

/// What a normalized request must share with a pool's to be served from it: all but what a
/// claim applies.
/// A desktop's key also carries the resolution its display is asked for, since a member's display
/// runs at one (`metadata.resolution`, default 1024x768).
pub(super) fn pool_key(request: &CreateSandboxRequest) -> String {
    let display =
        (request.template.as_deref() == Some(crate::lifecycle::DESKTOP_TEMPLATE)).then(|| {
            let (width, height) =
                crate::lifecycle::desktop_warm::requested_resolution(&request.metadata);
            format!(" display {width}x{height}")
        });
    let mut request = request.clone();
    request.env.clear();
    request.metadata.clear();
    request.timeout_ms = None;
    request.lifecycle = Lifecycle::default();
    let mut key = serde_json::to_string(&request).unwrap_or_default();
    key.push_str(&display.unwrap_or_default());
    key
}
