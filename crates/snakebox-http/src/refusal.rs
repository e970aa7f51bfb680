//! How the HTTP face says no: every refusal is a status and a JSON body `{"error", "hint"}`
//! (what was wrong, and how to fix it), and an engine error becomes one through the single
//! mapping of its kind to a status here ([`Refusal::from`]), so that every route answers the
//! same kind of failure the same way.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use snakebox_engine::{EngineError, ErrorKind};

/// A refusal: its status, what was wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) error: String,
    pub(crate) hint: String,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, error: &str, hint: &str) -> Refusal {
        Refusal {
            status,
            error: error.to_owned(),
            hint: hint.to_owned(),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(serde_json::json!({ "error": self.error, "hint": self.hint })),
        )
            .into_response()
    }
}

/// The status of each kind of engine error: the one mapping of the HTTP face.
pub(crate) fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Quota => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        // The session existed and will not come back.
        ErrorKind::SessionLost => StatusCode::GONE,
        ErrorKind::Failed => StatusCode::UNPROCESSABLE_ENTITY,
        // The client went away or asked to stop (nginx's "client closed request").
        ErrorKind::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<&EngineError> for Refusal {
    fn from(err: &EngineError) -> Refusal {
        Refusal {
            status: status_of(err.kind),
            error: err.message.clone(),
            hint: err.hint.clone().unwrap_or_else(|| match err.kind {
                ErrorKind::Internal | ErrorKind::Unavailable => "try again later".into(),
                _ => "check_environment describes what this server allows".into(),
            }),
        }
    }
}

/// A refusal as a response (the shorthand every route uses).
pub(crate) fn refusal(status: StatusCode, error: &str, hint: &str) -> Response {
    Refusal::new(status, error, hint).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_status_and_the_error_keeps_its_words() {
        let err = EngineError::new(ErrorKind::NotFound, "No run `x`").with_hint("list the runs");
        let refused = Refusal::from(&err);
        assert_eq!(refused.status, StatusCode::NOT_FOUND);
        assert_eq!(
            (refused.error.as_str(), refused.hint.as_str()),
            ("No run `x`", "list the runs")
        );
        assert_eq!(status_of(ErrorKind::Quota), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            status_of(ErrorKind::Internal),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(status_of(ErrorKind::Cancelled).as_u16(), 499);
        let bare = Refusal::from(&EngineError::new(ErrorKind::Unavailable, "busy"));
        assert_eq!(bare.hint, "try again later");
    }
}
