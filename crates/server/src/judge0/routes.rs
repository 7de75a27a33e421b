//! The Judge0 routes and their handlers. Errors have Judge0's shapes: `{"error": "..."}`
//! with 400, 404 or 503; `{"attribute": ["..."]}` with 422; an empty 401 or 403.

use std::sync::Arc;

use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::Judge0;
use super::config::JUDGE0_VERSION;
use super::encoding::{new_token, plausible_token};
use super::status::Status;
use super::submission::{Fields, NOT_UTF8, Outcome, Submission};
use super::wire::parse_submission;
use crate::auth::{canonical_key, hash_secret};
use crate::http::{Body, empty, full, linger, query_pairs};
use crate::store::now_ms;

/// Judge0's authentication and authorization headers (`AUTHN_HEADER`, `AUTHZ_HEADER`).
pub const AUTHN_HEADER: &str = "x-auth-token";
pub const AUTHZ_HEADER: &str = "x-auth-user";

const NOT_UTF8_MANY: &str = "some attributes for one or more submissions cannot be converted to UTF-8, use base64_encoded=true query parameter";

type Answer = Response<Body>;

/// An error answer: a status and its JSON body (built into a response at the end).
#[derive(Debug)]
struct Refusal(StatusCode, Value);

impl Refusal {
    fn new(status: StatusCode, message: &str) -> Refusal {
        Refusal(status, json!({ "error": message }))
    }
}

impl From<Refusal> for Answer {
    fn from(Refusal(status, body): Refusal) -> Answer {
        answer(status, &body)
    }
}

struct Call<'a> {
    judge0: &'a Arc<Judge0>,
    parts: Parts,
    query: Vec<(String, String)>,
    body: Option<Incoming>,
}

impl Call<'_> {
    fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, name: &str) -> bool {
        self.query(name) == Some("true")
    }

    /// A credential from its header or, as Judge0 also accepts, the query parameter of
    /// the header's name.
    fn credential(&self, header: &str) -> Option<String> {
        if let Some(value) = self.parts.headers.get(header) {
            return Some(value.to_str().unwrap_or_default().to_owned());
        }
        self.query
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(header))
            .map(|(_, v)| v.clone())
    }

    /// Whether the credential in `header` is an active API key (or auth is off).
    fn holds_key(&self, header: &str) -> bool {
        if self.judge0.daemon.config.no_auth {
            return true;
        }
        let Some(key) = self.credential(header).filter(|k| !k.is_empty()) else {
            return false;
        };
        self.judge0
            .daemon
            .store
            .key_hash_is_active(&hash_secret(&canonical_key(&key)))
            .unwrap_or(false)
    }

    async fn json_body(&mut self) -> Result<Value, Refusal> {
        let Some(body) = self.body.take() else {
            return Ok(json!({}));
        };
        let limit = self.judge0.daemon.config.max_body_bytes;
        let too_large = || {
            Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("the request body is larger than the limit of {limit} bytes"),
            )
        };
        if crate::http::content_length(&self.parts.headers).is_some_and(|len| len > limit) {
            linger(body);
            return Err(too_large());
        }
        let bytes = match Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX))
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
                return Err(too_large());
            }
            Err(err) => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    &format!("cannot read the body: {err}"),
                ));
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(json!({}));
        }
        serde_json::from_slice(&bytes).map_err(|err| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                &format!("the body is not valid JSON: {err}"),
            )
        })
    }

    fn fields(&self) -> Result<Fields, Refusal> {
        Fields::parse(self.query("fields")).map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, &e))
    }
}

/// Answers one request.
pub async fn serve(judge0: &Arc<Judge0>, request: Request<Incoming>) -> Answer {
    let (parts, body) = request.into_parts();
    let query = query_pairs(&parts.uri);
    let mut call = Call {
        judge0,
        parts,
        query,
        body: Some(body),
    };
    let answer = if call.holds_key(AUTHN_HEADER) {
        route(&mut call).await
    } else {
        status_only(StatusCode::UNAUTHORIZED)
    };
    if let Some(body) = call.body.take() {
        linger(body);
    }
    answer
}

async fn route(call: &mut Call<'_>) -> Answer {
    let path = call.parts.uri.path().trim_end_matches('/').to_owned();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let method = call.parts.method.clone();
    match (&method, segments.as_slice()) {
        (&Method::POST, ["submissions"]) => create(call).await,
        (&Method::GET, ["submissions"]) => list(call),
        (&Method::POST, ["submissions", "batch"]) => batch_create(call).await,
        (&Method::GET, ["submissions", "batch"]) => batch_show(call),
        (&Method::GET, ["submissions", token]) => show(call, token),
        (&Method::DELETE, ["submissions", _]) => {
            if call.holds_key(AUTHZ_HEADER) {
                error(StatusCode::BAD_REQUEST, "delete not allowed")
            } else {
                status_only(StatusCode::FORBIDDEN)
            }
        }
        (&Method::GET, ["languages"]) => languages(call, false),
        (&Method::GET, ["languages", "all"]) => languages(call, true),
        (&Method::GET, ["languages", id]) => language(call, id),
        (&Method::GET, ["statuses"]) => ok(&Value::Array(
            Status::ALL.iter().map(|s| json!(s.view())).collect(),
        )),
        (&Method::GET, ["about"]) => ok(&json!({
            "version": JUDGE0_VERSION,
            "homepage": null,
            "source_code": null,
            "maintainer": concat!("Airlock (airlockd ", env!("CARGO_PKG_VERSION"), "), Judge0 CE 1.13.1-compatible API"),
        })),
        (&Method::GET, ["version"]) => text(JUDGE0_VERSION),
        (&Method::GET, ["license"]) => text(
            "Airlock is licensed under the Apache License 2.0. This API is compatible with Judge0 CE 1.13.1; it contains no Judge0 code.\n",
        ),
        (&Method::GET, ["isolate"]) => text(concat!(
            "No isolate: each run is an Airlock process-tier sandbox (airlockd ",
            env!("CARGO_PKG_VERSION"),
            ").\n"
        )),
        (&Method::GET, ["system_info"]) => ok(&call.judge0.system_info),
        (&Method::GET, ["config_info"]) => ok(&call.judge0.config.info()),
        (&Method::GET, ["workers"]) => workers(call),
        (&Method::GET, ["statistics"]) => error(
            StatusCode::NOT_FOUND,
            "statistics are not kept by this server",
        ),
        (&Method::POST, ["authenticate"]) => status_only(StatusCode::OK),
        (&Method::POST, ["authorize"]) => status_only(if call.holds_key(AUTHZ_HEADER) {
            StatusCode::OK
        } else {
            StatusCode::FORBIDDEN
        }),
        _ => error(
            StatusCode::NOT_FOUND,
            &format!("no route matches {method} {}", call.parts.uri.path()),
        ),
    }
}

fn new_submission(parsed: super::wire::NewSubmission) -> Result<Submission, Refusal> {
    let token = new_token().map_err(|e| {
        Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot make a token: {e}"),
        )
    })?;
    Ok(Submission {
        token,
        status: Status::InQueue,
        params: parsed.params,
        texts: parsed.texts,
        outcome: Outcome::default(),
        created_ms: now_ms(),
        finished_ms: None,
    })
}

async fn create(call: &mut Call<'_>) -> Answer {
    let (wait, base64) = (call.flag("wait"), call.flag("base64_encoded"));
    let fields = match call.fields() {
        Ok(fields) => fields,
        Err(refusal) => return refusal.into(),
    };
    let body = match call.json_body().await {
        Ok(body) => body,
        Err(refusal) => return refusal.into(),
    };
    let config = &call.judge0.config;
    let parsed = match parse_submission(&body, base64, config) {
        Ok(parsed) => parsed,
        Err(errors) => return answer(StatusCode::UNPROCESSABLE_ENTITY, &json!(errors)),
    };
    let submission = match new_submission(parsed) {
        Ok(submission) => submission,
        Err(refusal) => return refusal.into(),
    };
    let token = submission.token.clone();
    let queue = &call.judge0.queue;
    let finished = wait.then(|| queue.waiter(&token));
    match queue.enqueue(vec![submission]).await {
        Ok(true) => {}
        Ok(false) => {
            queue.forget(&token);
            return error(StatusCode::SERVICE_UNAVAILABLE, "queue is full");
        }
        Err(err) => {
            queue.forget(&token);
            return store_error(&err);
        }
    }
    let Some(finished) = finished else {
        return answer(StatusCode::CREATED, &json!({ "token": token }));
    };
    // The run happens in the queue's workers (bounded concurrency), not in this request.
    let _ = finished.await;
    match call.judge0.daemon.store.judge0_get(&token) {
        Ok(Some(done)) => match render(call, &done, &fields, base64) {
            Some(value) => answer(StatusCode::CREATED, &value),
            None => answer(
                StatusCode::CREATED,
                &json!({ "token": token, "error": NOT_UTF8 }),
            ),
        },
        Ok(None) => error(StatusCode::NOT_FOUND, "the submission is gone"),
        Err(err) => store_error(&err),
    }
}

async fn batch_create(call: &mut Call<'_>) -> Answer {
    let base64 = call.flag("base64_encoded");
    let body = match call.json_body().await {
        Ok(body) => body,
        Err(refusal) => return refusal.into(),
    };
    if let Some(object) = body.as_object()
        && let Some(key) = object.keys().find(|k| *k != "submissions")
    {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("unknown attribute {key:?}: a batch is {{\"submissions\": [...]}}"),
        );
    }
    let items = body
        .get("submissions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let max = call.judge0.config.limits.max_submission_batch_size;
    if items.len() > max {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("number of submissions in a batch should be less than or equal to {max}"),
        );
    }
    if items.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "there should be at least one submission in a batch",
        );
    }
    let mut answers = Vec::with_capacity(items.len());
    let mut valid = Vec::new();
    for item in &items {
        match parse_submission(item, base64, &call.judge0.config) {
            Ok(parsed) => match new_submission(parsed) {
                Ok(submission) => {
                    answers.push(json!({ "token": submission.token }));
                    valid.push(submission);
                }
                Err(refusal) => return refusal.into(),
            },
            Err(errors) => answers.push(json!(errors)),
        }
    }
    if valid.is_empty() {
        return answer(StatusCode::UNPROCESSABLE_ENTITY, &Value::Array(answers));
    }
    match call.judge0.queue.enqueue(valid).await {
        Ok(true) => answer(StatusCode::CREATED, &Value::Array(answers)),
        Ok(false) => error(StatusCode::SERVICE_UNAVAILABLE, "queue is full"),
        Err(err) => store_error(&err),
    }
}

fn show(call: &Call<'_>, token: &str) -> Answer {
    let fields = match call.fields() {
        Ok(fields) => fields,
        Err(refusal) => return refusal.into(),
    };
    let found = if plausible_token(token) {
        call.judge0.daemon.store.judge0_get(token)
    } else {
        Ok(None)
    };
    match found {
        Ok(Some(submission)) => {
            match render(call, &submission, &fields, call.flag("base64_encoded")) {
                Some(value) => ok(&value),
                None => error(StatusCode::BAD_REQUEST, NOT_UTF8),
            }
        }
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            &format!("no submission has the token {token:?}"),
        ),
        Err(err) => store_error(&err),
    }
}

fn batch_show(call: &Call<'_>) -> Answer {
    let fields = match call.fields() {
        Ok(fields) => fields,
        Err(refusal) => return refusal.into(),
    };
    let list = call
        .parts
        .headers
        .get("tokens")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| call.query("tokens").map(str::to_owned))
        .unwrap_or_default();
    let tokens: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    let max = call.judge0.config.limits.max_submission_batch_size;
    if tokens.len() > max {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("number of submissions in a batch should be less than or equal to {max}"),
        );
    }
    if tokens.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "there should be at least one submission in a batch",
        );
    }
    let base64 = call.flag("base64_encoded");
    let mut out = Vec::with_capacity(tokens.len());
    for token in tokens {
        let found = if plausible_token(token) {
            match call.judge0.daemon.store.judge0_get(token) {
                Ok(found) => found,
                Err(err) => return store_error(&err),
            }
        } else {
            None
        };
        match found {
            None => out.push(Value::Null),
            Some(submission) => match render(call, &submission, &fields, base64) {
                Some(value) => out.push(value),
                None => return error(StatusCode::BAD_REQUEST, NOT_UTF8_MANY),
            },
        }
    }
    ok(&json!({ "submissions": out }))
}

fn list(call: &Call<'_>) -> Answer {
    if !call.holds_key(AUTHZ_HEADER) {
        return status_only(StatusCode::FORBIDDEN);
    }
    let fields = match call.fields() {
        Ok(fields) => fields,
        Err(refusal) => return refusal.into(),
    };
    // Ruby's `to_i`: a leading integer, else 0.
    let number = |name: &str, default: i64| {
        call.query(name).map_or(default, |v| {
            let digits: String = v
                .trim()
                .chars()
                .enumerate()
                .take_while(|(i, c)| c.is_ascii_digit() || (*i == 0 && *c == '-'))
                .map(|(_, c)| c)
                .collect();
            digits.parse().unwrap_or(0)
        })
    };
    let page = number("page", 1);
    let per_page = number("per_page", 20);
    if page <= 0 {
        return error(StatusCode::BAD_REQUEST, &format!("invalid page: {page}"));
    }
    if per_page < 0 {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("invalid per_page: {per_page}"),
        );
    }
    let per_page = u64::try_from(if per_page == 0 {
        20
    } else {
        per_page.min(1000)
    })
    .unwrap_or(20);
    let page = u64::try_from(page).unwrap_or(1);
    let (submissions, total) = match call
        .judge0
        .daemon
        .store
        .judge0_list((page - 1).saturating_mul(per_page), per_page)
    {
        Ok(found) => found,
        Err(err) => return store_error(&err),
    };
    let base64 = call.flag("base64_encoded");
    let mut out = Vec::with_capacity(submissions.len());
    for submission in &submissions {
        match render(call, submission, &fields, base64) {
            Some(value) => out.push(value),
            None => return error(StatusCode::BAD_REQUEST, NOT_UTF8_MANY),
        }
    }
    let total_pages = total.div_ceil(per_page);
    ok(&json!({
        "submissions": out,
        "meta": {
            "current_page": page,
            "next_page": (page < total_pages).then_some(page + 1),
            "prev_page": (page > 1).then(|| page - 1),
            "total_pages": total_pages,
            "total_count": total,
        }
    }))
}

fn render(
    call: &Call<'_>,
    submission: &Submission,
    fields: &Fields,
    base64: bool,
) -> Option<Value> {
    let name = call
        .judge0
        .config
        .languages
        .get(submission.params.language_id)
        .map(|l| l.name.as_str());
    submission.render(fields, base64, name).ok()
}

fn languages(call: &Call<'_>, all: bool) -> Answer {
    let table = &call.judge0.config.languages;
    let listed = if all { table.all() } else { table.active() };
    let values: Vec<Value> = listed
        .iter()
        .map(|l| {
            if all {
                json!({"id": l.id, "name": l.name, "is_archived": l.is_archived})
            } else {
                json!({"id": l.id, "name": l.name})
            }
        })
        .collect();
    ok(&Value::Array(values))
}

fn language(call: &Call<'_>, id: &str) -> Answer {
    let found = id
        .parse::<u32>()
        .ok()
        .and_then(|id| call.judge0.config.languages.get(id));
    match found {
        Some(l) => ok(&json!({
            "id": l.id,
            "name": l.name,
            "is_archived": l.is_archived,
            "source_file": l.source_file,
            "compile_cmd": l.compile_cmd,
            "run_cmd": l.run_cmd,
        })),
        None => error(
            StatusCode::NOT_FOUND,
            &format!("no language has the id {id:?}"),
        ),
    }
}

fn workers(call: &Call<'_>) -> Answer {
    let (queued, _) = call.judge0.daemon.store.judge0_counts().unwrap_or((0, 0));
    let (workers, working) = call.judge0.queue.workers();
    ok(&json!([{
        "queue": JUDGE0_VERSION,
        "size": queued,
        "available": workers,
        "idle": workers.saturating_sub(working),
        "working": working,
        "paused": 0,
        "failed": 0,
    }]))
}

fn answer(status: StatusCode, value: &Value) -> Answer {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}

fn ok(value: &Value) -> Answer {
    answer(StatusCode::OK, value)
}

fn error(status: StatusCode, message: &str) -> Answer {
    answer(status, &json!({ "error": message }))
}

fn store_error(err: &crate::store::StoreError) -> Answer {
    let message =
        crate::error::ApiError::from_chain(airlock_api::v1::ErrorCode::Internal, err).message;
    error(StatusCode::INTERNAL_SERVER_ERROR, &message)
}

fn text(body: &'static str) -> Answer {
    let mut response = Response::new(full(body));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn status_only(status: StatusCode) -> Answer {
    let mut response = Response::new(empty());
    *response.status_mut() = status;
    response
}
