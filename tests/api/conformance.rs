//! Holding a real answer against the OpenAPI document: a small JSON Schema check (enough for the
//! keywords the document uses; `scripts/fuzz-api.sh` does the thorough job with schemathesis),
//! and [`Conformance`], which sends a request and checks its status, content type, body and
//! headers against the operation's documented answers.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::helpers::*;

/// Resolves `{"$ref": "#/components/..."}`.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let pointer = r.strip_prefix('#').expect("local $ref");
            resolve(doc, doc.pointer(pointer).unwrap_or_else(|| panic!("{r}")))
        }
        None => schema,
    }
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        other => panic!("unknown type {other}"),
    }
}

/// Validates `v` against `schema`; pushes what does not match, with where, onto `errors`.
pub fn check(doc: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let s = resolve(doc, schema);
    if let Some(t) = s.get("type") {
        if !type_matches(t, v) {
            errors.push(format!("{at}: not of type {t} (value {v})"));
            return;
        }
    }
    check_value(s, v, at, errors);
    check_one_of(doc, s, v, at, errors);
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for a in all {
            check(doc, a, v, at, errors);
        }
    }
    if let Value::Object(obj) = v {
        check_object(doc, s, obj, v, at, errors);
    }
    if let (Value::Array(items), Some(is)) = (v, s.get("items")) {
        check_array(doc, s, is, items, at, errors);
    }
}

fn type_matches(t: &Value, v: &Value) -> bool {
    match t {
        Value::String(t) => type_ok(t, v),
        Value::Array(ts) => ts.iter().any(|t| type_ok(t.as_str().unwrap(), v)),
        _ => panic!("bad type {t}"),
    }
}

/// `enum`, `minimum` and `maximum`.
fn check_value(s: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let mut fail = |m: &str| errors.push(format!("{at}: {m} (value {v})"));
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            fail(&format!("not one of {e:?}"));
        }
    }
    if let Some(n) = v.as_f64() {
        let bound = |k: &str| s.get(k).and_then(Value::as_f64);
        if bound("minimum").is_some_and(|m| n < m) {
            fail("below minimum");
        }
        if bound("maximum").is_some_and(|m| n > m) {
            fail("above maximum");
        }
    }
}

/// `oneOf`: exactly one alternative matches.
fn check_one_of(doc: &Value, s: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(alts) = s.get("oneOf").and_then(Value::as_array) else {
        return;
    };
    let matching = alts
        .iter()
        .filter(|a| {
            let mut e = Vec::new();
            check(doc, a, v, at, &mut e);
            e.is_empty()
        })
        .count();
    if matching != 1 {
        errors.push(format!(
            "{at}: matches {matching} of oneOf, not 1 (value {v})"
        ));
    }
}

/// `required`, `properties` and `additionalProperties: false`.
fn check_object(
    doc: &Value,
    s: &Value,
    obj: &serde_json::Map<String, Value>,
    v: &Value,
    at: &str,
    errors: &mut Vec<String>,
) {
    let props = s.get("properties").and_then(Value::as_object);
    let required = s.get("required").and_then(Value::as_array);
    for r in required.into_iter().flatten() {
        let r = r.as_str().unwrap();
        if !obj.contains_key(r) {
            errors.push(format!("{at}: required {r} missing in {v}"));
        }
    }
    for (k, x) in obj {
        match props.and_then(|p| p.get(k)) {
            Some(ps) => check(doc, ps, x, &format!("{at}.{k}"), errors),
            None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                errors.push(format!("{at}: {k} is not in the document"))
            }
            None => {}
        }
    }
}

/// `minItems`, `maxItems` and `items`.
fn check_array(
    doc: &Value,
    s: &Value,
    item_schema: &Value,
    items: &[Value],
    at: &str,
    errors: &mut Vec<String>,
) {
    let bound = |k: &str| s.get(k).and_then(Value::as_u64);
    let len = items.len() as u64;
    if bound("minItems").is_some_and(|m| len < m) {
        errors.push(format!("{at}: fewer than minItems"));
    }
    if bound("maxItems").is_some_and(|m| len > m) {
        errors.push(format!("{at}: more than maxItems"));
    }
    for (i, x) in items.iter().enumerate() {
        check(doc, item_schema, x, &format!("{at}[{i}]"), errors);
    }
}

/// Sends a request and holds its answer against the document: the status is documented for the
/// operation, the content type is the documented one, the body matches the schema and the
/// documented headers that came have the documented type.
pub struct Conformance {
    pub doc: Value,
    /// (method, path template, status) seen, to prove the test covered what it meant to.
    pub seen: BTreeSet<(String, String, u16)>,
}

/// An answer as it came.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    text: String,
}

impl Conformance {
    pub fn new(doc: Value) -> Self {
        Conformance {
            doc,
            seen: BTreeSet::new(),
        }
    }

    /// Sends `method path` (`template` is its documented path) and checks the answer; returns
    /// its status and body (JSON, or the text of another content type, or null without one).
    pub async fn send(
        &mut self,
        app: &TestApp,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
        token: Option<&str>,
    ) -> (u16, Value) {
        self.send_with(app, method, template, path, body, token, &[])
            .await
    }

    /// As [`Conformance::send`], with request headers.
    #[allow(clippy::too_many_arguments)]
    pub async fn send_with(
        &mut self,
        app: &TestApp,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
        token: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let got = request(app, method, path, body, token, headers).await;
        let status = got.status;
        let op = &self.doc["paths"][template][method];
        assert!(op.is_object(), "{method} {template} is not documented");
        let answer = &op["responses"][status.to_string()];
        assert!(
            answer.is_object(),
            "{method} {path}: status {status} is not documented ({})",
            got.text
        );
        let at = format!("{method} {path} {status}");
        let value = self.body_matches(answer, &got, &at);
        headers_match(answer, &got.headers);
        self.seen
            .insert((method.to_owned(), template.to_owned(), status));
        (status, value)
    }

    /// The content type is the documented one and a JSON body matches the documented schema.
    fn body_matches(&self, answer: &Value, got: &Answer, at: &str) -> Value {
        let ct = got
            .headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let documented_ct: Vec<&String> = answer["content"]
            .as_object()
            .map(|c| c.keys().collect())
            .unwrap_or_default();
        match (&ct, documented_ct.first()) {
            (None, None) => Value::Null,
            (Some(ct), Some(doc_ct)) => {
                assert!(
                    ct.starts_with(doc_ct.as_str()),
                    "{at}: content-type {ct}, documented {doc_ct}"
                );
                if doc_ct.as_str() != "application/json" {
                    return Value::String(got.text.clone());
                }
                let v: Value = serde_json::from_str(&got.text).unwrap();
                let mut errors = Vec::new();
                let schema = &answer["content"][doc_ct.as_str()]["schema"];
                check(&self.doc, schema, &v, "$", &mut errors);
                assert!(errors.is_empty(), "{at}: {errors:#?}");
                v
            }
            (ct, doc_ct) => panic!("{at}: content-type {ct:?}, documented {doc_ct:?}"),
        }
    }
}

async fn request(
    app: &TestApp,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> Answer {
    let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let mut req = app.http.request(m, app.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = &body {
        req = req.json(b);
    }
    let r = req.send().await.unwrap();
    Answer {
        status: r.status().as_u16(),
        headers: r.headers().clone(),
        text: r.text().await.unwrap(),
    }
}

/// The documented headers that came have the documented type.
fn headers_match(answer: &Value, headers: &reqwest::header::HeaderMap) {
    for (name, h) in answer["headers"].as_object().into_iter().flatten() {
        if let Some(got) = headers.get(name.as_str()) {
            let got = got.to_str().unwrap();
            if h["schema"]["type"] == "integer" {
                assert!(got.parse::<u64>().is_ok(), "{name}: {got}");
            }
        }
    }
}
