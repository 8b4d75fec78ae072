//! API keys: every route but `/health` needs one when the server has any
//! (`--api-key`, `--api-key-file`). A client sends `Authorization: Bearer
//! KEY` (OpenAI's clients) or `x-api-key: KEY`; keys are compared in
//! constant time, so response timing does not reveal how much of a guess
//! was right.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::errors::ApiError;
use crate::state::Shared;

/// Whether `given` is one of `keys`, comparing each in constant time (all
/// keys are compared, so the position of a match does not show either).
pub fn key_matches(keys: &[Vec<u8>], given: &[u8]) -> bool {
    keys.iter().fold(0u8, |found, key| found | key.as_slice().ct_eq(given).unwrap_u8()) == 1
}

/// The key a request carries, if any.
fn presented(request: &Request) -> Option<&[u8]> {
    let headers = request.headers();
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value.as_bytes();
        let scheme = b"Bearer ";
        return Some(if value.len() >= scheme.len() && value[..scheme.len()].eq_ignore_ascii_case(scheme) {
            value[scheme.len()..].trim_ascii()
        } else {
            value
        });
    }
    headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii())
}

/// Refuses a request without a valid key (401) when the server has keys.
pub async fn require_key(State(state): State<Shared>, request: Request, next: Next) -> Response {
    if state.api_keys.is_empty() {
        return next.run(request).await;
    }
    match presented(&request) {
        None => ApiError::unauthorized(
            "no API key given: send it as `Authorization: Bearer KEY` (or the `x-api-key` header)",
        )
        .into_response(),
        Some(key) if key_matches(&state.api_keys, key) => next.run(request).await,
        Some(_) => ApiError::unauthorized("invalid API key").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listed_key_matches() {
        let keys = vec![b"alpha".to_vec(), b"beta-key".to_vec()];
        assert!(key_matches(&keys, b"alpha"));
        assert!(key_matches(&keys, b"beta-key"));
        assert!(!key_matches(&keys, b"alph"));
        assert!(!key_matches(&keys, b"alphaa"));
        assert!(!key_matches(&keys, b""));
        assert!(!key_matches(&[], b"alpha"));
    }
}
