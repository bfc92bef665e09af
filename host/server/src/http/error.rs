//! The one place core error kinds become HTTP statuses (Triton's table), and the `{"error"}` body.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use wisp_core::{Error, ErrorKind};

/// The HTTP status for an error kind: Triton's mapping (`docs/protocol/README.md`).
pub fn status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unavailable | ErrorKind::Exhausted => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::InvalidArg | ErrorKind::AlreadyExists => StatusCode::BAD_REQUEST,
    }
}

/// An error answered as `{"error": "<message>"}` with [`status`].
#[derive(Debug)]
pub struct ApiError(pub Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.0.message() });
        (status(self.0.kind()), axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_status_table() {
        assert_eq!(status(ErrorKind::InvalidArg), StatusCode::BAD_REQUEST);
        assert_eq!(status(ErrorKind::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(
            status(ErrorKind::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(status(ErrorKind::Unsupported), StatusCode::NOT_IMPLEMENTED);
        assert_eq!(
            status(ErrorKind::Internal),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(status(ErrorKind::AlreadyExists), StatusCode::BAD_REQUEST);
        assert_eq!(status(ErrorKind::TooLarge), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(status(ErrorKind::Forbidden), StatusCode::FORBIDDEN);
    }
}
