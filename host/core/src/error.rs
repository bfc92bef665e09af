//! The closed set of error kinds every Wisp crate reports, and the core error type.
//!
//! Front ends map [`ErrorKind`] to an HTTP status (`wisp_server::http::error`) and a gRPC code
//! (`wisp_server::grpc::status`) in exactly one place each; everything else only picks the kind.

/// What went wrong, as a client sees it. Mirrors Triton's `TRITONSERVER_Error_Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request or configuration is malformed (HTTP 400).
    InvalidArg,
    /// A model, version or tensor does not exist (HTTP 404).
    NotFound,
    /// The model exists but is not ready, or a queue is full (HTTP 503).
    Unavailable,
    /// The feature is not supported (HTTP 501).
    Unsupported,
    /// Something is already there (HTTP 400).
    AlreadyExists,
    /// The server failed (HTTP 500).
    Internal,
    /// The request is larger than a configured limit allows (HTTP 413, gRPC RESOURCE_EXHAUSTED).
    TooLarge,
    /// The server is at a capacity limit for now; retry later (HTTP 503, gRPC
    /// RESOURCE_EXHAUSTED).
    Exhausted,
    /// The server's settings do not allow this call from where it came (HTTP 403, gRPC
    /// PERMISSION_DENIED).
    Forbidden,
}

impl ErrorKind {
    /// Triton's name for the kind, used in logs and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArg => "INVALID_ARG",
            ErrorKind::NotFound => "NOT_FOUND",
            ErrorKind::Unavailable => "UNAVAILABLE",
            ErrorKind::Unsupported => "UNSUPPORTED",
            ErrorKind::AlreadyExists => "ALREADY_EXISTS",
            ErrorKind::Internal => "INTERNAL",
            ErrorKind::TooLarge | ErrorKind::Exhausted => "RESOURCE_EXHAUSTED",
            ErrorKind::Forbidden => "PERMISSION_DENIED",
        }
    }
}

/// An error with its kind and a message meant for the client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    /// An [`ErrorKind::InvalidArg`] error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArg, message)
    }
    /// An [`ErrorKind::NotFound`] error.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    /// An [`ErrorKind::Unavailable`] error.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    /// An [`ErrorKind::Internal`] error.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    /// An [`ErrorKind::Exhausted`] error.
    pub fn exhausted(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Exhausted, message)
    }
    /// An [`ErrorKind::TooLarge`] error.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::TooLarge, message)
    }
    /// An [`ErrorKind::Forbidden`] error.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, message)
    }
    /// An [`ErrorKind::Unsupported`] error.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }
    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The message for the client.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// The same error with `prefix: ` in front of its message.
    pub fn context(self, prefix: impl std::fmt::Display) -> Self {
        Error {
            kind: self.kind,
            message: format!("{prefix}: {}", self.message),
        }
    }
}

/// Result with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
