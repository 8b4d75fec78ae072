//! Errors in OpenAI's envelope: `{"error": {"message", "type", "param",
//! "code"}}` with the HTTP status that fits, whatever produced them (a
//! request's validation, the engine, axum's own rejections, an unknown
//! route: [`envelope_layer`] wraps any error response that is not JSON yet).

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};
use axum::response::IntoResponse;
use mlxcel_runtime::Error;
use serde_json::json;

/// An error answered to a client.
#[derive(Clone, Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `timeout`, ...).
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.into()), ..ApiError::invalid(message) }
    }

    /// 400 for a field this server does not implement.
    pub fn unsupported(param: &str, why: &str) -> ApiError {
        ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::invalid_param(param, format!("{param} is not supported by this server{why}"))
        }
    }

    /// 401 `authentication_error`.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
        }
    }

    /// 404 `not_found_error`.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// 503 while the bundle loads.
    pub fn loading() -> ApiError {
        ApiError {
            code: Some("loading"),
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "Loading model")
        }
    }

    /// 503 once shutdown has begun.
    pub fn shutting_down() -> ApiError {
        ApiError {
            code: Some("shutting_down"),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "the server is shutting down")
        }
    }

    /// 503 for a request that ran past `--timeout`.
    pub fn timeout(seconds: u64) -> ApiError {
        ApiError {
            code: Some("timeout"),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                format!("the request ran longer than the server's timeout of {seconds} s and was cancelled"),
            )
        }
    }

    /// 501 for an endpoint turned off (llama-server's `/metrics` without `--metrics`).
    pub fn not_supported(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_IMPLEMENTED, "not_supported_error", message)
    }

    /// 500 `server_error`.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The envelope's JSON.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl ApiError {
    /// A runtime error of a generation request whose prompt came in the
    /// field `prompt_field` (chat's `messages`, completions' `prompt`): the
    /// errors about the prompt (a context overflow, a token outside the
    /// vocabulary) name that field; the rest as [`From<Error>`].
    pub fn for_prompt(e: Error, prompt_field: &'static str) -> ApiError {
        match e {
            Error::ContextOverflow { .. } => ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::invalid_param(prompt_field, e.to_string())
            },
            Error::InvalidParameter { name: "prompt", .. } => ApiError::invalid_param(prompt_field, e.to_string()),
            // The server's only grammar is `response_format`'s.
            Error::InvalidParameter { name: "grammar", message } => ApiError {
                code: Some("unsupported_schema"),
                ..ApiError::invalid_param("response_format", format!("invalid parameter response_format: {message}"))
            },
            e => e.into(),
        }
    }
}

impl From<Error> for ApiError {
    /// The runtime's errors: the client's (400, 429) apart from the server's
    /// (500, 503). A generation request's go through [`ApiError::for_prompt`],
    /// which knows the field its prompt came in.
    fn from(e: Error) -> ApiError {
        let message = e.to_string();
        match e {
            Error::InvalidParameter { name, .. } => ApiError::invalid_param(name, message),
            Error::ContextOverflow { .. } => {
                ApiError { code: Some("context_length_exceeded"), ..ApiError::invalid(message) }
            }
            Error::KvBudget { .. } => ApiError { code: Some("kv_budget_exceeded"), ..ApiError::invalid(message) },
            // A template's own `raise_exception` refuses the conversation
            // (roles out of order, ...): the client's to fix.
            Error::ChatTemplate(_) => ApiError::invalid_param("messages", message),
            Error::Tokenizer(_) => ApiError::invalid(message),
            Error::QueueFull { .. } => ApiError {
                code: Some("queue_full"),
                retry_after: Some(1),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            },
            Error::EngineStopped => ApiError {
                code: Some("engine_stopped"),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", message)
            },
            _ => ApiError::internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The error type of OpenAI's envelope for a bare status (axum's
/// rejections, routing).
fn kind_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => "not_found_error",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::NOT_IMPLEMENTED => "not_supported_error",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
        s if s.is_server_error() => "server_error",
        _ => "invalid_request_error",
    }
}

/// Puts every error response that is not JSON yet (axum's plain-text
/// rejections, tower-http's 413, a 405) into the envelope, keeping its
/// text as the message.
pub async fn envelope_layer(response: Response<Body>) -> Response<Body> {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024).await.map(|b| String::from_utf8_lossy(&b).into_owned());
    let mut message = text.unwrap_or_default().trim().to_string();
    if message.is_empty() {
        message = match status {
            StatusCode::NOT_FOUND => "no such route".to_string(),
            StatusCode::PAYLOAD_TOO_LARGE => "the request body is larger than the server's limit".to_string(),
            s => s.canonical_reason().unwrap_or("error").to_string(),
        };
    }
    let code = (status == StatusCode::PAYLOAD_TOO_LARGE).then_some("request_too_large");
    let error = ApiError { status, message, kind: kind_of(status), param: None, code, retry_after: None };
    let mut out = error.into_response();
    // Keep the headers the original carried (Allow, Retry-After, CORS).
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_errors_map_to_the_client_or_the_server() {
        let e: ApiError = Error::InvalidParameter { name: "top_p", message: "must be ...".into() }.into();
        assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some("top_p")));
        let e: ApiError = Error::ContextOverflow { prompt: 10, requested: 0, context: 8 }.into();
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, Some("context_length_exceeded")));
        let e: ApiError = Error::KvBudget { tokens: 1, needed: 2, budget: 1 }.into();
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, Some("kv_budget_exceeded")));
        let e: ApiError = Error::QueueFull { waiting: 3 }.into();
        assert_eq!((e.status, e.retry_after), (StatusCode::TOO_MANY_REQUESTS, Some(1)));
        let e: ApiError = Error::EngineStopped.into();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        let e: ApiError = Error::Step("boom".into()).into();
        assert_eq!((e.status, e.kind), (StatusCode::INTERNAL_SERVER_ERROR, "server_error"));
        assert_eq!(e.body()["error"]["message"], "the decode step failed: boom");
    }

    #[test]
    fn prompt_errors_name_the_field_of_their_endpoint() {
        let overflow = || Error::ContextOverflow { prompt: 10, requested: 0, context: 8 };
        let bad_token = || Error::InvalidParameter { name: "prompt", message: "token 9 at position 1 ...".into() };
        for field in ["messages", "prompt"] {
            let e = ApiError::for_prompt(overflow(), field);
            assert_eq!(
                (e.status, e.param.as_deref(), e.code),
                (StatusCode::BAD_REQUEST, Some(field), Some("context_length_exceeded"))
            );
            let e = ApiError::for_prompt(bad_token(), field);
            assert_eq!((e.status, e.param.as_deref(), e.code), (StatusCode::BAD_REQUEST, Some(field), None));
        }
        // Other errors map as without an endpoint.
        let e = ApiError::for_prompt(Error::InvalidParameter { name: "top_p", message: "x".into() }, "messages");
        assert_eq!(e.param.as_deref(), Some("top_p"));
        let e = ApiError::for_prompt(Error::KvBudget { tokens: 1, needed: 2, budget: 1 }, "prompt");
        assert_eq!((e.param, e.code), (None, Some("kv_budget_exceeded")));
    }
}
