//! The HTTP port's OpenAPI document (`crates/fencelock-server/openapi.json`,
//! built in as [`fencelock_server::OPENAPI`] and served at `/v1/openapi.json`)
//! against the router's table ([`fencelock_server::HTTP_ROUTES`]) and against
//! the answers of a real node.
//!
//! Invariant: the document describes exactly what the port serves, and what
//! it says an answer is, the server answers.
//! - Its operations (method, path, operationId) are the table's, both ways;
//!   each operationId once; every operation shows an example of its success
//!   answer, and of its request body if it takes one; every `$ref` resolves;
//!   every path parameter is declared.
//! - Every error answer is the one `Error` schema (except the few listed in
//!   [`NOT_THE_ERROR_SHAPE`], which the server answers otherwise), whose
//!   `code` enum is [`ErrorCode::ALL`]'s wire forms, each with its HTTP status;
//!   every error example's code is one answered with its response's status.
//! - Every example validates against its schema (request examples against
//!   the request schema, answers against the answer's, the examples of a
//!   component schema against it): the examples cannot drift from the
//!   schemas.
//! - A node (authentication off) answers each operation as the document
//!   says: every operation of the table is called at least once, and every
//!   answer (success and error: busy, not_holder, slot_done, lease_not_found,
//!   invalid_argument, not_found) validates against the schema the document
//!   gives for that operation and status; every request body the test sends
//!   validates against the document's request schema.
//!
//! The validator here ([`Schemas`]) knows the subset of JSON Schema the
//! document uses (`type`, also as a list, `enum`, `properties`, `required`,
//! `additionalProperties: false`, `items`, `oneOf`, `anyOf`, `$ref` into
//! `#/components/schemas`, `minimum`, `maximum`, `minLength`, `maxLength`,
//! `minItems`, `maxItems`, and the few `pattern`s it knows); a schema using
//! any other keyword fails the first test, so the document stays within what
//! is checked. Answers are validated strictly: an object whose schema lists
//! `properties` may carry no field it does not list, even where the schema
//! leaves `additionalProperties` open (the document is to name every field the
//! server sends, while telling clients nothing against new ones).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use fencelock_core::ErrorCode;
use fencelock_http::{Client, Request};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support;

/// The keys of a path item that are operations.
const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// The error statuses whose body is not the `Error` schema, with the schema
/// they have: a node that does not serve answers `/healthz` with its health
/// document (a probe reads the same fields either way).
const NOT_THE_ERROR_SHAPE: [(&str, &str, &str); 1] = [("health", "503", "Health")];

/// The patterns [`Schemas`] knows.
const ID_PATTERN: &str = "^[0-9]{1,20}$";
const REVISION_PATTERN: &str = "^[0-9]+\\.[0-9]+$";
const REVISION_OR_INDEX_PATTERN: &str = "^[0-9]+(\\.[0-9]+)?$";

fn document() -> Value {
    serde_json::from_str(fencelock_server::OPENAPI).expect("openapi.json is JSON")
}

/// One operation of the document.
struct Operation<'a> {
    method: String,
    path: String,
    id: String,
    op: &'a Value,
}

fn operations(doc: &Value) -> Vec<Operation<'_>> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("the document has paths") {
        for (key, op) in item.as_object().expect("a path item is an object") {
            if METHODS.contains(&key.as_str()) {
                let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{key} {path} has no operationId"));
                out.push(Operation { method: key.to_uppercase(), path: path.clone(), id: id.to_string(), op });
            }
        }
    }
    out
}

fn operation<'a>(doc: &'a Value, id: &str) -> Operation<'a> {
    operations(doc).into_iter().find(|o| o.id == id).unwrap_or_else(|| panic!("the document has no operation {id}"))
}

/// What the local reference `r` (`#/…`) points at.
fn pointer<'a>(doc: &'a Value, r: &str) -> Option<&'a Value> {
    doc.pointer(r.strip_prefix('#')?)
}

/// `v`, or what its `$ref` points at (a response, a parameter, a body).
fn deref<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => pointer(doc, r).unwrap_or_else(|| panic!("{r} points at nothing")),
        None => v,
    }
}

/// The examples of a media type: its `example` and each of its `examples`.
fn examples(media: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    if let Some(e) = media.get("example") {
        out.push(("example".to_string(), e));
    }
    for (name, e) in media.get("examples").and_then(Value::as_object).into_iter().flatten() {
        out.push((name.clone(), &e["value"]));
    }
    out
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// The subset of JSON Schema the document keeps to, as a validator.
struct Schemas<'a> {
    doc: &'a Value,
}

/// The keywords [`Schemas`] checks, and those it ignores (annotations).
const KEYWORDS: [&str; 16] = [
    "$ref",
    "type",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "oneOf",
    "anyOf",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
];
const ANNOTATIONS: [&str; 4] = ["description", "default", "examples", "title"];

impl<'a> Schemas<'a> {
    /// Whether `v` is what `schema` says; else what is not. `strict`: an
    /// object may carry only the `properties` its schema lists.
    fn validate(&self, schema: &Value, v: &Value, strict: bool) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        self.check(schema, v, "$", strict, &mut errors);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    fn check(&self, schema: &Value, v: &Value, at: &str, strict: bool, errors: &mut Vec<String>) {
        let Some(s) = schema.as_object() else {
            errors.push(format!("{at}: the schema {schema} is not an object"));
            return;
        };
        for (key, kw) in s {
            match key.as_str() {
                "$ref" => match kw.as_str().and_then(|r| pointer(self.doc, r)) {
                    Some(target) => self.check(target, v, at, strict, errors),
                    None => errors.push(format!("{at}: $ref {kw} points at nothing")),
                },
                "type" => {
                    if !type_ok(kw, v) {
                        errors.push(format!("{at}: {v} is not of type {kw}"));
                    }
                }
                "enum" => {
                    if !kw.as_array().is_some_and(|e| e.contains(v)) {
                        errors.push(format!("{at}: {v} is not one of {kw}"));
                    }
                }
                "properties" => {
                    let (Some(props), Some(obj)) = (kw.as_object(), v.as_object()) else { continue };
                    for (name, sub) in props {
                        if let Some(x) = obj.get(name) {
                            self.check(sub, x, &format!("{at}.{name}"), strict, errors);
                        }
                    }
                    if strict && !s.contains_key("additionalProperties") {
                        for name in obj.keys().filter(|n| !props.contains_key(*n)) {
                            errors.push(format!("{at}: has `{name}`, which the document does not list"));
                        }
                    }
                }
                "required" => {
                    let Some(obj) = v.as_object() else { continue };
                    for name in kw.as_array().into_iter().flatten().filter_map(Value::as_str) {
                        if !obj.contains_key(name) {
                            errors.push(format!("{at}: `{name}` is required, and missing"));
                        }
                    }
                }
                "additionalProperties" => {
                    if kw != &Value::Bool(false) {
                        errors.push(format!("{at}: additionalProperties other than false is not in the subset"));
                        continue;
                    }
                    let Some(obj) = v.as_object() else { continue };
                    let props = s.get("properties").and_then(Value::as_object);
                    for name in obj.keys().filter(|n| !props.is_some_and(|p| p.contains_key(*n))) {
                        errors.push(format!("{at}: has `{name}`, which the schema does not allow"));
                    }
                }
                "items" => {
                    for (i, x) in v.as_array().into_iter().flatten().enumerate() {
                        self.check(kw, x, &format!("{at}[{i}]"), strict, errors);
                    }
                }
                "oneOf" | "anyOf" => {
                    let subs = kw.as_array().map(Vec::as_slice).unwrap_or_default();
                    let results: Vec<Result<(), Vec<String>>> =
                        subs.iter().map(|sub| self.validate_at(sub, v, at, strict)).collect();
                    let passed = results.iter().filter(|r| r.is_ok()).count();
                    let ok = if key == "oneOf" { passed == 1 } else { passed >= 1 };
                    if !ok {
                        let why: Vec<String> = results.into_iter().filter_map(Result::err).flatten().collect();
                        errors.push(format!("{at}: {passed} of the {} schemas of {key} match ({why:?})", subs.len()));
                    }
                }
                "minimum" | "maximum" => {
                    let (Some(bound), Some(n)) = (kw.as_f64(), v.as_f64()) else { continue };
                    if (key == "minimum" && n < bound) || (key == "maximum" && n > bound) {
                        errors.push(format!("{at}: {v} is beyond the {key} {kw}"));
                    }
                }
                "minLength" | "maxLength" => {
                    let (Some(bound), Some(text)) = (kw.as_u64(), v.as_str()) else { continue };
                    let len = text.chars().count() as u64;
                    if (key == "minLength" && len < bound) || (key == "maxLength" && len > bound) {
                        errors.push(format!("{at}: {len} characters, beyond the {key} {bound}"));
                    }
                }
                "minItems" | "maxItems" => {
                    let (Some(bound), Some(items)) = (kw.as_u64(), v.as_array()) else { continue };
                    let len = items.len() as u64;
                    if (key == "minItems" && len < bound) || (key == "maxItems" && len > bound) {
                        errors.push(format!("{at}: {len} items, beyond the {key} {bound}"));
                    }
                }
                "pattern" => {
                    let Some(text) = v.as_str() else { continue };
                    match pattern_matches(kw.as_str().unwrap_or_default(), text) {
                        Some(true) => {}
                        Some(false) => errors.push(format!("{at}: {text:?} does not match {kw}")),
                        None => errors.push(format!("{at}: the pattern {kw} is not one this validator knows")),
                    }
                }
                k if ANNOTATIONS.contains(&k) || k.starts_with("x-") => {}
                other => errors.push(format!("{at}: the keyword `{other}` is not in the subset this test checks")),
            }
        }
    }

    fn validate_at(&self, schema: &Value, v: &Value, at: &str, strict: bool) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        self.check(schema, v, at, strict, &mut errors);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// The keywords of `schema` and of the schemas inside it that are not in
    /// the subset.
    fn outside_subset(schema: &Value, at: &str, errors: &mut Vec<String>) {
        let Some(s) = schema.as_object() else {
            errors.push(format!("{at}: a schema that is not an object"));
            return;
        };
        for (key, kw) in s {
            let known =
                KEYWORDS.contains(&key.as_str()) || ANNOTATIONS.contains(&key.as_str()) || key.starts_with("x-");
            if !known {
                errors.push(format!("{at}: the keyword `{key}` is not in the subset this test checks"));
            }
            match key.as_str() {
                "properties" => {
                    for (name, sub) in kw.as_object().into_iter().flatten() {
                        Self::outside_subset(sub, &format!("{at}/properties/{name}"), errors);
                    }
                }
                "items" => Self::outside_subset(kw, &format!("{at}/items"), errors),
                "oneOf" | "anyOf" => {
                    for (i, sub) in kw.as_array().into_iter().flatten().enumerate() {
                        Self::outside_subset(sub, &format!("{at}/{key}/{i}"), errors);
                    }
                }
                "additionalProperties" if kw != &Value::Bool(false) => {
                    errors.push(format!("{at}: additionalProperties other than false"));
                }
                "pattern" if pattern_matches(kw.as_str().unwrap_or_default(), "0").is_none() => {
                    errors.push(format!("{at}: the pattern {kw} is not one this validator knows"));
                }
                _ => {}
            }
        }
    }
}

fn type_ok(t: &Value, v: &Value) -> bool {
    match t {
        Value::String(t) => is_type(t, v),
        Value::Array(ts) => ts.iter().any(|t| t.as_str().is_some_and(|t| is_type(t, v))),
        _ => false,
    }
}

fn is_type(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_u64() || v.is_i64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    }
}

/// Whether `text` matches `pattern`, for the patterns the document uses
/// (`None` for any other).
fn pattern_matches(pattern: &str, text: &str) -> Option<bool> {
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    match pattern {
        ID_PATTERN => Some(digits(text) && text.len() <= 20),
        REVISION_PATTERN => Some(text.split_once('.').is_some_and(|(i, s)| digits(i) && digits(s))),
        REVISION_OR_INDEX_PATTERN => Some(match text.split_once('.') {
            Some((i, s)) => digits(i) && digits(s),
            None => digits(text),
        }),
        _ => None,
    }
}

/// Every `$ref` of `v` that resolves to nothing, and every schema (under a
/// `schema` key, or an `x-event-data`) outside the subset.
fn walk(doc: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (key, x) in o {
                let here = format!("{at}/{key}");
                if key == "$ref" && x.as_str().and_then(|r| pointer(doc, r)).is_none() {
                    errors.push(format!("{here}: {x} points at nothing"));
                }
                if key == "schema" || key == "x-event-data" {
                    Schemas::outside_subset(x, &here, errors);
                }
                walk(doc, x, &here, errors);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                walk(doc, x, &format!("{at}/{i}"), errors);
            }
        }
        _ => {}
    }
}

/// The document's operations are the router's table, both ways; every
/// operation shows its examples; every error answer is the `Error` schema,
/// whose codes are `ErrorCode::ALL` with their statuses.
#[tokio::test]
async fn the_document_lists_every_route_with_one_error_shape() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!((&doc["info"]["title"], &doc["info"]["version"]), (&json!("fencelock"), &json!("1")));
    let ops = operations(&doc);

    let documented: BTreeSet<(String, String, String)> =
        ops.iter().map(|o| (o.method.clone(), o.path.clone(), o.id.clone())).collect();
    let served: BTreeSet<(String, String, String)> =
        fencelock_server::HTTP_ROUTES.iter().map(|&(m, p, id)| (m.into(), p.into(), id.into())).collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "served but not in openapi.json: {missing:?}; in openapi.json but not served: {extra:?}"
    );
    let mut ids = BTreeSet::new();
    for o in &ops {
        assert!(ids.insert(o.id.as_str()), "operationId {} is given twice", o.id);
    }

    let error_schema = schema_ref("Error");
    for o in &ops {
        let responses = o.op["responses"].as_object().unwrap_or_else(|| panic!("{} has no responses", o.id));
        let successes: Vec<_> = responses.iter().filter(|(status, _)| status.starts_with('2')).collect();
        assert!(!successes.is_empty(), "{} has no success response", o.id);
        for (status, r) in successes {
            let content = deref(&doc, r)["content"].as_object();
            assert!(content.is_some_and(|c| !c.is_empty()), "{} {status} has no content", o.id);
            for (media, m) in content.into_iter().flatten() {
                assert!(!examples(m).is_empty(), "{} {status} {media} has no example", o.id);
            }
        }
        if let Some(body) = o.op.get("requestBody") {
            let content = deref(&doc, body)["content"].as_object();
            assert!(content.is_some_and(|c| !c.is_empty()), "{}'s request body has no content", o.id);
            for (media, m) in content.into_iter().flatten() {
                assert!(m.get("schema").is_some(), "{}'s request body {media} has no schema", o.id);
                assert!(!examples(m).is_empty(), "{}'s request body {media} has no example", o.id);
            }
        }
        for (status, r) in responses.iter().filter(|(s, _)| s.starts_with('4') || s.starts_with('5')) {
            let media = &deref(&doc, r)["content"]["application/json"];
            let schema = &media["schema"];
            match NOT_THE_ERROR_SHAPE.iter().find(|(id, s, _)| *id == o.id && s == status) {
                Some((_, _, name)) => assert_eq!(schema, &schema_ref(name), "{} {status}", o.id),
                None => {
                    assert_eq!(schema, &error_schema, "{} answers {status} with {schema}, not the Error schema", o.id);
                    for (name, example) in examples(media) {
                        let code = example["error"]["code"].as_str().unwrap_or_default();
                        let code =
                            ErrorCode::parse(code).unwrap_or_else(|| panic!("{} {status} {name}: code {code:?}", o.id));
                        assert_eq!(
                            code.http_status().to_string(),
                            *status,
                            "{} {status}: example {name} is {code}",
                            o.id
                        );
                    }
                }
            }
        }
        let params: Vec<&Value> = o.op["parameters"].as_array().into_iter().flatten().map(|p| deref(&doc, p)).collect();
        for segment in o.path.split('/').filter(|s| s.starts_with('{')) {
            let name = segment.trim_start_matches('{').trim_end_matches('}');
            let declared = params.iter().any(|p| p["in"] == "path" && p["name"] == name && p["required"] == true);
            assert!(declared, "{} does not declare its path parameter {name}", o.id);
        }
    }
    for (id, status, _) in NOT_THE_ERROR_SHAPE {
        let listed = ops.iter().any(|o| o.id == id && o.op["responses"].get(status).is_some());
        assert!(listed, "({id}, {status}) is not in the document any more: drop it from NOT_THE_ERROR_SHAPE");
    }

    let error = &doc["components"]["schemas"]["Error"];
    let codes: Vec<&str> = error["properties"]["error"]["properties"]["code"]["enum"]
        .as_array()
        .expect("Error's code has an enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let wire: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(codes, wire, "the Error schema's codes are ErrorCode::ALL's, in its order");
    let statuses = error["x-status-of-code"].as_object().expect("Error has x-status-of-code");
    assert_eq!(statuses.len(), ErrorCode::ALL.len());
    for code in ErrorCode::ALL {
        assert_eq!(statuses.get(code.as_str()), Some(&json!(code.http_status())), "the status of {code}");
    }

    let mut errors = Vec::new();
    walk(&doc, &doc, "#", &mut errors);
    for (name, schema) in doc["components"]["schemas"].as_object().expect("components/schemas") {
        Schemas::outside_subset(schema, &format!("#/components/schemas/{name}"), &mut errors);
    }
    assert!(errors.is_empty(), "{errors:#?}");
}

/// Every example of the document validates against its schema: request
/// examples against the request's, answers against the answer's (strictly),
/// and the examples of a component schema against it.
#[tokio::test]
async fn every_example_matches_its_schema() {
    let doc = document();
    let schemas = Schemas { doc: &doc };
    let mut errors = Vec::new();
    let mut checked = 0;
    let mut check = |what: String, schema: &Value, example: &Value, strict: bool| {
        checked += 1;
        if let Err(e) = schemas.validate(schema, example, strict) {
            errors.push(format!("{what}: {e:?}"));
        }
    };
    for o in operations(&doc) {
        if let Some(body) = o.op.get("requestBody") {
            for (media, m) in deref(&doc, body)["content"].as_object().into_iter().flatten() {
                for (name, example) in examples(m) {
                    check(format!("{} request {media} {name}", o.id), &m["schema"], example, false);
                }
            }
        }
        for (status, r) in o.op["responses"].as_object().into_iter().flatten() {
            for (media, m) in deref(&doc, r)["content"].as_object().into_iter().flatten() {
                for (name, example) in examples(m) {
                    check(format!("{} {status} {media} {name}", o.id), &m["schema"], example, true);
                }
            }
        }
    }
    for (name, schema) in doc["components"]["schemas"].as_object().expect("components/schemas") {
        for (i, example) in schema["examples"].as_array().into_iter().flatten().enumerate() {
            check(
                format!("components/schemas/{name} example {i}"),
                &json!({ "$ref": format!("#/components/schemas/{name}") }),
                example,
                true,
            );
        }
    }
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(checked > 40, "only {checked} examples");
}

/// A node serves the document it was built with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_serves_the_document() {
    let served = async {
        let dir = tempfile::tempdir().unwrap();
        let (running, _grpc) = support::start(dir.path()).await;
        let http = Client::new(running.http_addr).timeout(Duration::from_secs(10));
        let r = http.send(Request::get("/v1/openapi.json")).await.expect("GET /v1/openapi.json");
        assert_eq!(r.status, 200, "{}", r.text());
        let served: Value = serde_json::from_slice(&r.body).expect("the served document is JSON");
        assert_eq!(served, document());
        running.shutdown().await;
    };
    tokio::time::timeout(Duration::from_secs(60), served).await.expect("within 60 s");
}

/// A request body: none, JSON the document's request schema must accept,
/// or raw bytes (a malformed body).
enum Body<'b> {
    None,
    Json(Value),
    Raw(&'b str),
}

/// A node's HTTP port, each answer checked against the document.
struct Node<'d> {
    http: Client,
    doc: &'d Value,
    schemas: Schemas<'d>,
    /// The operations called.
    called: BTreeSet<String>,
}

impl<'d> Node<'d> {
    /// Calls operation `id` at `path` (its template filled in, and a query)
    /// with `body`; checks that the answer's status is one the document
    /// lists for it and that its body is that response's schema. The status
    /// and the body (JSON, or a string for text).
    async fn call(&mut self, id: &str, path: &str, body: Body<'_>) -> (u16, Value) {
        let o = operation(self.doc, id);
        assert!(path_matches(&o.path, path), "{path} is not a path of {id} ({})", o.path);
        let bytes = match &body {
            Body::None => Vec::new(),
            Body::Json(v) => {
                let request = deref(self.doc, &o.op["requestBody"]);
                let schema = &request["content"]["application/json"]["schema"];
                assert!(!schema.is_null(), "{id} takes no body in the document");
                if let Err(e) = self.schemas.validate(schema, v, false) {
                    panic!("{id}: the document refuses the request {v}: {e:?}");
                }
                serde_json::to_vec(v).unwrap()
            }
            Body::Raw(raw) => raw.as_bytes().to_vec(),
        };
        let json_header = [("Content-Type", "application/json".to_string())];
        let headers: &[(&str, String)] = if bytes.is_empty() { &[] } else { &json_header };
        let req = Request { method: &o.method, path, headers, body: &bytes };
        let r = self.http.send(req).await.unwrap_or_else(|e| panic!("{id} {path}: {e}"));
        let status = r.status.to_string();
        let response = o.op["responses"]
            .get(&status)
            .map(|r| deref(self.doc, r))
            .unwrap_or_else(|| panic!("{id} {path} answered {status}, which the document does not list: {}", r.text()));
        let content = response["content"].as_object().expect("a response has content");
        let (media, m) = content
            .iter()
            .find(|(media, _)| *media == "application/json")
            .or_else(|| content.iter().next())
            .expect("a response has a media type");
        let value = match media.as_str() {
            "application/json" => serde_json::from_slice(&r.body)
                .unwrap_or_else(|e| panic!("{id} {status}: the answer is not JSON ({e}): {}", r.text())),
            _ => Value::String(r.text()),
        };
        if let Err(e) = self.schemas.validate(&m["schema"], &value, true) {
            panic!("{id} {path} {status}: the answer is not what the document says:\n{value:#}\n{e:#?}");
        }
        self.called.insert(id.to_string());
        (r.status, value)
    }

    /// [`Node::call`] that must succeed (200): its body.
    async fn ok(&mut self, id: &str, path: &str, body: Body<'_>) -> Value {
        let (status, v) = self.call(id, path, body).await;
        assert_eq!(status, 200, "{id} {path}: {v}");
        v
    }

    /// [`Node::call`] that must fail with `code` (and its status): the error.
    async fn refused(&mut self, id: &str, path: &str, body: Body<'_>, code: ErrorCode) -> Value {
        let (status, v) = self.call(id, path, body).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (code.http_status(), Some(code.as_str())),
            "{id} {path}: {v}"
        );
        v["error"].clone()
    }
}

/// Whether `path` (with any query) is an instance of `template`.
fn path_matches(template: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len() && t.iter().zip(&p).all(|(t, p)| (t.starts_with('{') && !p.is_empty()) || t == p)
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_else(|| panic!("{v} is not a string")).to_string()
}

/// Reads from `s` into `buf` until `done(buf)`, within 10 s.
async fn read_until(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) {
    let reading = async {
        let mut chunk = [0u8; 4096];
        while !done(buf) {
            let n = s.read(&mut chunk).await.expect("read the watch");
            assert!(n > 0, "the watch ended: {}", String::from_utf8_lossy(buf));
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reading).await.expect("the watch answers within 10 s");
}

/// A watch of `prefix` over HTTP/1.0 (its body ends with the connection, not
/// in chunks), once its head is in: the stream, and the rest read so far.
async fn open_watch(addr: SocketAddr, prefix: &str) -> (tokio::net::TcpStream, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect for the watch");
    let head = format!("GET /v1/watch?prefix={prefix} HTTP/1.0\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    s.write_all(head.as_bytes()).await.expect("send the watch");
    let mut buf = Vec::new();
    let end_of_head = |b: &[u8]| b.windows(4).position(|w| w == b"\r\n\r\n");
    read_until(&mut s, &mut buf, |b| end_of_head(b).is_some()).await;
    let end = end_of_head(&buf).unwrap() + 4;
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    assert!(head.split_whitespace().nth(1) == Some("200"), "the watch answered {head}");
    assert!(head.contains("content-type: text/event-stream"), "the watch answered {head}");
    (s, buf[end..].to_vec())
}

/// Calls every operation of the table on a node (authentication off), the
/// lock API's answers and refusals included, each answer validated against
/// the document; and a watch's event against `WatchEvent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_match_the_document() {
    let doc = document();
    let run = async {
        let dir = tempfile::tempdir().unwrap();
        let (running, mut grpc) = support::start(dir.path()).await;
        support::lease(&mut grpc, 1000).await;
        let http = Client::new(running.http_addr).timeout(Duration::from_secs(10));
        let mut n = Node { http, doc: &doc, schemas: Schemas { doc: &doc }, called: BTreeSet::new() };

        // The node, the document, the metrics.
        let health = n.ok("health", "/healthz", Body::None).await;
        assert_eq!(health["status"], "ok");
        n.ok("openapi", "/v1/openapi.json", Body::None).await;
        n.ok("metrics", "/metrics", Body::None).await;

        // Leases.
        let lease = n.ok("grantLease", "/v1/leases", Body::Json(json!({ "ttl_ms": 20000 }))).await;
        let l = text(&lease["lease_id"]);
        assert_eq!(lease["ttl_ms"], 20000);
        let kept = n.ok("keepAlive", &format!("/v1/leases/{l}/keepalive"), Body::None).await;
        assert_eq!(kept["lease_id"], json!(l));
        let body = Body::Json(json!({ "request_id": "77" }));
        n.ok("keepAlive", &format!("/v1/leases/{l}/keepalive"), body).await;

        // A lock whose name has a `/`, on the lease; as its lease, its check, its value, its description.
        let body = Body::Json(json!({ "lease_id": l, "identity": "openapi-test", "value": "v1" }));
        let got = n.ok("acquire", "/v1/locks/openapi%2Fa/acquire", body).await;
        let t = text(&got["token"]);
        assert_eq!(
            (&got["lock"], &got["lease_created"], &got["grants"][0]["token"]),
            (&json!("openapi/a"), &json!(false), &json!(t))
        );
        let info = n.ok("describeLease", &format!("/v1/leases/{l}"), Body::None).await;
        assert_eq!(info["locks"], json!([{ "lock": "openapi/a", "token": t }]));
        let check = n.ok("check", &format!("/v1/locks/openapi%2Fa/check?token={t}"), Body::None).await;
        assert_eq!(check, json!({ "current": true, "current_token": t }));
        let body = Body::Json(json!({ "lease_id": l, "token": t, "value_base64": "AAE=" }));
        n.ok("setValue", "/v1/locks/openapi%2Fa/value", body).await;
        let lock = n.ok("describeLock", "/v1/locks/openapi%2Fa", Body::None).await;
        let holder = &lock["holder"];
        assert_eq!((holder["token"].as_str(), &holder["value_base64"]), (Some(t.as_str()), &json!("AAE=")));
        let list = n.ok("listLocks", "/v1/locks?prefix=openapi%2F", Body::None).await;
        assert_eq!(list["locks"][0]["name"], "openapi/a");

        // Contention: busy (on a lease the call grants, revoked again), then not_holder.
        let body = Body::Json(json!({ "ttl_ms": 5000, "wait_ms": 0 }));
        let busy = n.refused("acquire", "/v1/locks/openapi%2Fa/acquire", body, ErrorCode::Busy).await;
        assert_eq!(busy["holder"], json!({ "lease_id": l, "token": t }));
        let release = json!({ "lease_id": l, "token": t });
        n.ok("release", "/v1/locks/openapi%2Fa/release", Body::Json(release.clone())).await;
        n.refused("release", "/v1/locks/openapi%2Fa/release", Body::Json(release), ErrorCode::NotHolder).await;

        // A lease the acquire grants; a downgrade (ids as JSON numbers, which requests may use).
        let got = n.ok("acquire", "/v1/locks/openapi%2Fb/acquire", Body::Json(json!({ "ttl_ms": 5000 }))).await;
        assert_eq!((&got["lease_created"], &got["ttl_ms"]), (&json!(true), &json!(5000)));
        let (bl, bt): (u64, u64) = (text(&got["lease_id"]).parse().unwrap(), text(&got["token"]).parse().unwrap());
        let body = Body::Json(json!({ "lease_id": bl, "token": bt }));
        n.ok("downgrade", "/v1/locks/openapi%2Fb/downgrade", body).await;

        // A once-per slot: completed, then refused as slot_done.
        let body = Body::Json(json!({ "lease_id": l, "once_per": "slot-1" }));
        let job = n.ok("acquire", "/v1/locks/openapi%2Fjob/acquire", body).await;
        let jt = text(&job["token"]);
        let body = Body::Json(json!({ "lease_id": l, "token": jt, "slot": "slot-1", "exit_code": 3 }));
        n.ok("completeSlot", "/v1/locks/openapi%2Fjob/complete", body).await;
        let body = Body::Json(json!({ "lease_id": l, "token": jt }));
        n.ok("release", "/v1/locks/openapi%2Fjob/release", body).await;
        let body = Body::Json(json!({ "lease_id": l, "once_per": "slot-1" }));
        let done = n.refused("acquire", "/v1/locks/openapi%2Fjob/acquire", body, ErrorCode::SlotDone).await;
        assert_eq!((&done["token"], &done["exit_code"]), (&json!(jt), &json!(3)));

        // A semaphore, resized.
        let body = Body::Json(json!({ "lease_id": l, "permits": 2 }));
        n.ok("acquire", "/v1/locks/openapi%2Fsem/acquire", body).await;
        let resized = n.ok("resize", "/v1/locks/openapi%2Fsem/permits", Body::Json(json!({ "permits": 3 }))).await;
        assert_eq!(resized, json!({ "was": 2 }));

        // An election: campaign, leader, proclaim, resign, no leader.
        let body = Body::Json(json!({ "ttl_ms": 5000, "identity": "candidate-1", "value": "here" }));
        let elected = n.ok("campaign", "/v1/elections/openapi-e/campaign", body).await;
        let (el, term) = (text(&elected["lease_id"]), text(&elected["term"]));
        let leader = n.ok("leader", "/v1/elections/openapi-e/leader", Body::None).await;
        assert_eq!((&leader["leader"]["term"], &leader["leader"]["identity"]), (&json!(term), &json!("candidate-1")));
        let body = Body::Json(json!({ "lease_id": el, "term": term, "value": "there" }));
        n.ok("proclaim", "/v1/elections/openapi-e/proclaim", body).await;
        let body = Body::Json(json!({ "lease_id": el, "term": term }));
        n.ok("resign", "/v1/elections/openapi-e/resign", body).await;
        let leader = n.ok("leader", "/v1/elections/openapi-e/leader", Body::None).await;
        assert_eq!(leader["leader"], Value::Null);

        // A watch: the event of a grant, as the document's WatchEvent.
        let (mut watch, mut buf) = open_watch(running.http_addr, "openapi%2Fw").await;
        n.ok("acquire", "/v1/locks/openapi%2Fw/acquire", Body::Json(json!({ "lease_id": l }))).await;
        read_until(&mut watch, &mut buf, |b| b.windows(2).any(|w| w == b"\n\n")).await;
        let event = String::from_utf8_lossy(&buf).into_owned();
        let field = |name: &str| {
            let line = event.lines().find_map(|l| l.strip_prefix(&format!("{name}:")));
            line.unwrap_or_else(|| panic!("the event has no {name}: {event}")).trim().to_string()
        };
        let data: Value = serde_json::from_str(&field("data")).expect("the event's data is JSON");
        let media = &operation(&doc, "watch").op["responses"]["200"]["content"]["text/event-stream"];
        if let Err(e) = n.schemas.validate(&media["x-event-data"], &data, true) {
            panic!("the watch's event is not the document's WatchEvent:\n{data:#}\n{e:#?}");
        }
        assert_eq!((field("event"), field("id")), (text(&data["kind"]), text(&data["revision"])));
        assert_eq!((&data["kind"], &data["lock"]), (&json!("granted"), &json!("openapi/w")));
        drop(watch);
        n.called.insert("watch".into());

        // A fence's refusal report (issue 36): recorded, and seen by a watch
        // as `write_refused`, a WatchEvent too; one no fence makes is refused.
        let (mut watch, mut buf) = open_watch(running.http_addr, "openapi%2Fr").await;
        let body = Body::Json(json!({ "refused_token": "5", "highest_token": "9", "resource": "orders-42" }));
        let recorded = n.ok("reportRefusal", "/v1/locks/openapi%2Fr/refusals", body).await;
        assert_eq!(recorded, json!({ "recorded": true }));
        read_until(&mut watch, &mut buf, |b| b.windows(2).any(|w| w == b"\n\n")).await;
        let event = String::from_utf8_lossy(&buf).into_owned();
        let line = event.lines().find_map(|l| l.strip_prefix("data:")).expect("the event has data");
        let data: Value = serde_json::from_str(line.trim()).expect("the event's data is JSON");
        if let Err(e) = n.schemas.validate(&media["x-event-data"], &data, true) {
            panic!("the report's event is not the document's WatchEvent:\n{data:#}\n{e:#?}");
        }
        let got = (&data["kind"], &data["lock"], &data["token"], &data["highest_token"], &data["resource"]);
        assert_eq!(got, (&json!("write_refused"), &json!("openapi/r"), &json!("5"), &json!("9"), &json!("orders-42")));
        drop(watch);
        let body = Body::Json(json!({ "refused_token": 9, "highest_token": 9 }));
        let bad = n.refused("reportRefusal", "/v1/locks/openapi%2Fr/refusals", body, ErrorCode::InvalidArgument).await;
        assert!(text(&bad["message"]).contains("not below the highest token"), "{bad}");

        // The group and its policy.
        n.ok("clusterStatus", "/v1/cluster", Body::None).await;
        n.ok("snapshot", "/v1/snapshot", Body::None).await;
        let body = Body::Json(json!({ "id": 7, "addr": "no port" }));
        n.refused("addMember", "/v1/cluster/members", body, ErrorCode::InvalidArgument).await;
        n.ok("removeMember", "/v1/cluster/members/99", Body::None).await;
        let change = json!({ "op": "put_role", "name": "openapi-reader", "rules": [{ "prefix": "openapi/", "verbs": ["read"] }] });
        n.call("authChange", "/v1/auth", Body::Json(change)).await;
        n.ok("authView", "/v1/auth", Body::None).await;

        // Refusals: a body that is not JSON, an unknown field, an unknown route.
        let bad = n.refused("grantLease", "/v1/leases", Body::Raw("{\"ttl_ms\":"), ErrorCode::InvalidArgument).await;
        assert!(text(&bad["message"]).starts_with("the body is not JSON"), "{bad}");
        let body = Body::Raw("{\"ttl_ms\": 1000, \"tll_ms\": 5}");
        let unknown = n.refused("grantLease", "/v1/leases", body, ErrorCode::InvalidArgument).await;
        assert_eq!(unknown["field"], "tll_ms");
        let r = n.http.send(Request::get("/v1/no-such-route")).await.expect("GET an unknown route");
        let v: Value = serde_json::from_slice(&r.body).expect("a refusal is JSON");
        assert_eq!((r.status, v["error"]["code"].as_str()), (404, Some("not_found")), "{v}");
        n.schemas.validate(&schema_ref("Error"), &v, true).unwrap_or_else(|e| panic!("{v}: {e:?}"));

        // The lease revoked: gone.
        n.ok("revokeLease", &format!("/v1/leases/{l}"), Body::None).await;
        let gone = n.refused("describeLease", &format!("/v1/leases/{l}"), Body::None, ErrorCode::LeaseNotFound).await;
        assert!(text(&gone["message"]).contains(&l), "{gone}");

        let uncalled: Vec<&str> =
            fencelock_server::HTTP_ROUTES.iter().map(|r| r.2).filter(|id| !n.called.contains(*id)).collect();
        assert!(uncalled.is_empty(), "not checked against a real answer: {uncalled:?}");
        running.shutdown().await;
    };
    tokio::time::timeout(Duration::from_secs(120), run).await.expect("within 120 s");
}
