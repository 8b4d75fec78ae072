//! The router: every route, the layers around them (API keys, CORS, the
//! body limit, the error envelope, the request log), and the small routes
//! (health, models, metrics, tokenize, detokenize, apply-template).

use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Router, extract::DefaultBodyLimit};
use serde::Deserialize;
use serde_json::{Value, json};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::errors::{ApiError, envelope_layer};
use crate::generate::{self, LoggedByHandler};
use crate::metrics::RequestLabels;
use crate::openai::{parse_object, typed};
use crate::state::Shared;
use crate::{auth, openai, tools};

/// The whole application.
pub fn router(state: Shared, max_body: usize, cors_origins: &[String]) -> anyhow::Result<Router> {
    // Everything but /health needs a key when the server has keys.
    let protected = Router::new()
        .route("/v1/chat/completions", post(generate::chat))
        .route("/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completions))
        .route("/completions", post(generate::completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_key));
    let mut app = Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .merge(protected)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::map_response(envelope_layer))
        .layer(middleware::from_fn_with_state(state.clone(), log_request));
    if !cors_origins.is_empty() {
        let origin = if cors_origins.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            let origins = cors_origins
                .iter()
                .map(|o| {
                    HeaderValue::from_str(o).map_err(|_| anyhow::anyhow!("--cors-origin {o:?} is not a header value"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            AllowOrigin::list(origins)
        };
        app = app.layer(
            CorsLayer::new()
                .allow_origin(origin)
                .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
                // The headers the preflight asks for, named: a `*` does not
                // cover `Authorization` (the Fetch standard), so a browser
                // sending a key would be refused.
                .allow_headers(AllowHeaders::mirror_request()),
        );
    }
    Ok(app.with_state(state))
}

/// Logs each request answered here (generations log themselves when they
/// end) and counts every request in `mlxcel_requests_total`.
async fn log_request(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched".to_string(), |m| m.as_str().to_string());
    let response = next.run(request).await;
    let status = response.status().as_u16();
    state.metrics.requests.get_or_create(&RequestLabels { route, status }).inc();
    if response.extensions().get::<LoggedByHandler>().is_none() {
        tracing::info!(
            request = %format_args!("{method} {path}"),
            status,
            total_ms = format_args!("{:.1}", started.elapsed().as_secs_f64() * 1e3),
            "request"
        );
    }
    response
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!("no route for {} {}", request.method(), request.uri().path()))
}

/// `GET /health`: 503 while the bundle loads (or once shutdown began), then 200.
async fn health(State(state): State<Shared>) -> Response {
    if state.shutdown.is_draining() {
        return ApiError::shutting_down().into_response();
    }
    match state.engine() {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/models`: the one model served.
async fn models(State(state): State<Shared>) -> Result<Json<Value>, ApiError> {
    let model = state.model()?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_name(),
            "object": "model",
            "created": state.started,
            "owned_by": "mlxcel",
            "meta": {"architecture": model.architecture, "n_ctx": model.context_length(),
                     "vocab_size": model.config.vocab_size},
        }],
    })))
}

/// `GET /metrics`: Prometheus text with `--metrics`, else 501 (as llama-server).
async fn metrics(State(state): State<Shared>) -> Response {
    if !state.metrics_enabled {
        return ApiError::not_supported("metrics are off: start the server with --metrics").into_response();
    }
    let stats = state.engine.get().map(|e| e.stats());
    let text = state.metrics.render(stats);
    let content_type = HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8");
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], text).into_response()
}

#[derive(Deserialize)]
struct TokenizeBody {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

/// `POST /tokenize`: `{"content", "add_special", "with_pieces"}` →
/// `{"tokens": [id...]}` or, with pieces, `{"tokens": [{"id", "piece"}]}`
/// (a piece that is not whole UTF-8 is a list of bytes), as llama-server.
async fn tokenize(State(state): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let model = state.model()?.clone();
    let object = parse_object(&body, &[&["content", "add_special", "with_pieces", "parse_special"]])?;
    if object.get("parse_special").is_some_and(|v| v != &Value::Bool(true)) {
        return Err(ApiError::unsupported("parse_special", " (special tokens are always parsed)"));
    }
    let req: TokenizeBody = typed(&object)?;
    let tokens = tokio::task::spawn_blocking(move || -> Result<Value, ApiError> {
        let ids = model.tokenizer.encode(&req.content, req.add_special)?;
        if !req.with_pieces {
            return Ok(json!(ids));
        }
        Ok(ids
            .iter()
            .map(|&id| {
                let bytes = model.tokenizer.token_bytes(id)?;
                let piece = match String::from_utf8(bytes) {
                    Ok(text) => json!(text),
                    Err(e) => json!(e.into_bytes()),
                };
                Ok(json!({"id": id, "piece": piece}))
            })
            .collect::<Result<Vec<Value>, ApiError>>()?
            .into())
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(Json(json!({"tokens": tokens})))
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

/// `POST /detokenize`: `{"tokens": [id...]}` → `{"content": text}`.
async fn detokenize(State(state): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let model = state.model()?.clone();
    let req: DetokenizeBody = typed(&parse_object(&body, &[&["tokens"]])?)?;
    let vocab = model.config.vocab_size;
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid_param("tokens", format!("token {bad} is not in the vocabulary of {vocab}")));
    }
    let content = model.tokenizer.decode(&req.tokens, false)?;
    Ok(Json(json!({"content": content})))
}

/// `POST /apply-template`: `{"messages": [...]}` and optionally `tools`,
/// `tool_choice`, `parallel_tool_calls` → `{"prompt": text}`, the chat
/// template's rendering (with the assistant's turn opener) as a chat
/// request with the same fields would see it.
async fn apply_template(State(state): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let model = state.model()?.clone();
    let object = parse_object(&body, &[&["messages", "tools", "tool_choice", "parallel_tool_calls"]])?;
    let messages = openai::messages(&object)?;
    let tools = tools::parse(&object)?;
    // Rendering is CPU work (bounded by the template's fuel).
    let prompt = tokio::task::spawn_blocking(move || -> Result<String, ApiError> {
        let template =
            model.chat_template.as_ref().ok_or_else(|| ApiError::invalid("the bundle has no chat template"))?;
        let (messages, specs) = tools::conversation(messages, tools.as_ref(), openai::tool_format(&model));
        let (bos, eos) = (model.tokenizer.bos_text(), model.tokenizer.eos_text());
        Ok(template.render_with_tools(&messages, &specs, true, bos, eos)?)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(Json(json!({"prompt": prompt})))
}
