//! Holding a real answer against the OpenAPI document: [`Conformance`] sends a request and checks
//! its status, content type, body and headers against the operation's documented answers.
//!
//! Bodies are validated by the `jsonschema` crate as JSON Schema 2020-12, the dialect of an
//! OpenAPI 3.1 document (`Conformance::new` refuses a document that names another), plus one rule
//! of our own that JSON Schema lacks (`WrittenAsInteger`). `scripts/fuzz-api.sh` does the
//! thorough job with schemathesis.

use std::collections::{BTreeSet, HashMap};

use jsonschema::{Keyword, ValidationError, Validator};
use serde_json::{json, Value};

use crate::helpers::*;
use crate::openapi::fetch_doc;

/// The schema dialect of an OpenAPI 3.1 document that names none: JSON Schema 2020-12, plus
/// OpenAPI's own keywords (`discriminator`, `xml`, `example`...), which only annotate.
const OAS_31_DIALECT: &str = "https://spec.openapis.org/oas/3.1/dialect/base";

/// The keyword [`mark_integers`] puts beside every `type` that allows integers but not numbers.
const WRITTEN_AS_INTEGER: &str = "x-test-written-as-integer";

/// Compiles `schema`, a schema of `doc`, for JSON Schema 2020-12. Its `$ref`s point into the
/// document (`#/components/schemas/...`), so the document's components go with it, at the root
/// where those pointers look; nothing is fetched.
fn validator(doc: &Value, schema: &Value) -> Validator {
    let mut root = schema.clone();
    root.as_object_mut()
        .unwrap_or_else(|| panic!("schema {schema} is not an object"))
        .insert("components".to_owned(), doc["components"].clone());
    mark_integers(&mut root);
    jsonschema::draft202012::options()
        .offline()
        .with_keyword(WRITTEN_AS_INTEGER, |_, _, _| Ok(Box::new(WrittenAsInteger)))
        .build(&root)
        .unwrap_or_else(|e| panic!("schema {schema}: {e}"))
}

/// What of `v` does not match `validator`, each with where (`#` and a JSON pointer into `v`).
fn errors(validator: &Validator, v: &Value) -> Vec<String> {
    validator
        .iter_errors(v)
        .map(|e| format!("#{}: {e}", e.instance_path()))
        .collect()
}

/// JSON Schema counts `5.0` as an integer (a number with no fraction); a client generated from
/// the document may not (a Go `int64` or a Rust `u64` refuses it), so an answer must write its
/// integers as integers, as serde does for integer types. The hand-written validator this
/// replaced held answers to that; `mark_integers` and this keyword keep it.
struct WrittenAsInteger;

impl<'i> Keyword<'i> for WrittenAsInteger {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        if self.is_valid(instance) {
            Ok(())
        } else {
            Err(ValidationError::custom(format!(
                "{instance} is not written as an integer"
            )))
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        // serde_json reads a number as f64 only when it has a fraction or an exponent, or does
        // not fit 64 bits; other types are the `type` keyword's to judge.
        !instance.is_f64()
    }
}

/// Puts [`WRITTEN_AS_INTEGER`] beside every `type` in `schema` that allows `integer` and not
/// `number`. `enum` and `const` hold values, not schemas, and are left as they are.
fn mark_integers(schema: &mut Value) {
    match schema {
        Value::Object(m) => {
            let integer_only = match m.get("type") {
                Some(Value::String(t)) => t == "integer",
                Some(Value::Array(ts)) => {
                    ts.iter().any(|t| t == "integer") && !ts.iter().any(|t| t == "number")
                }
                _ => false,
            };
            if integer_only {
                m.insert(WRITTEN_AS_INTEGER.to_owned(), Value::Bool(true));
            }
            for (k, v) in m.iter_mut() {
                if k != "enum" && k != "const" {
                    mark_integers(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mark_integers),
        _ => {}
    }
}

/// Sends a request and holds its answer against the document: the status is documented for the
/// operation, the content type is the documented one, the body matches the schema and the
/// documented headers that came have the documented type.
pub struct Conformance {
    pub doc: Value,
    /// (method, path template, status) seen, to prove the test covered what it meant to.
    pub seen: BTreeSet<(String, String, u16)>,
    /// The body schema of each answer met so far, compiled once: "method template status".
    validators: HashMap<String, Validator>,
}

/// An answer as it came.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    text: String,
}

impl Conformance {
    pub fn new(doc: Value) -> Self {
        // Bodies are judged as JSON Schema 2020-12: right for OpenAPI 3.1 and its own dialect.
        let version = doc["openapi"].as_str().unwrap_or_default();
        assert!(version.starts_with("3.1."), "OpenAPI {version}, not 3.1");
        let dialect = doc.get("jsonSchemaDialect").and_then(Value::as_str);
        assert!(
            dialect.is_none_or(|d| d == OAS_31_DIALECT),
            "jsonSchemaDialect {dialect:?}"
        );
        Conformance {
            doc,
            seen: BTreeSet::new(),
            validators: HashMap::new(),
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
        let key = format!("{method} {template} {status}");
        let value = body_matches(&self.doc, &mut self.validators, &key, answer, &got, &at);
        headers_match(answer, &got.headers);
        self.seen
            .insert((method.to_owned(), template.to_owned(), status));
        (status, value)
    }
}

/// The content type is the documented one and a JSON body matches the documented schema (its
/// validator compiled once per answer `key`, kept in `validators`).
fn body_matches(
    doc: &Value,
    validators: &mut HashMap<String, Validator>,
    key: &str,
    answer: &Value,
    got: &Answer,
    at: &str,
) -> Value {
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
            let schema = &answer["content"][doc_ct.as_str()]["schema"];
            let validator = validators
                .entry(key.to_owned())
                .or_insert_with(|| validator(doc, schema));
            let errors = errors(validator, &v);
            assert!(errors.is_empty(), "{at}: {errors:#?}");
            v
        }
        (ct, doc_ct) => panic!("{at}: content-type {ct:?}, documented {doc_ct:?}"),
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

/// The validator the answers are held to refuses each kind of departure from the document that
/// the hand-written one it replaced caught (type, `required`, `additionalProperties: false`,
/// `minimum`, `enum`, `oneOf`, `minItems`, an integer written with a fraction) and the `pattern`s
/// it did not; the documented shapes pass.
#[tokio::test]
async fn conformance_refuses_answers_the_document_does_not_allow() {
    let app = spawn_app().await;
    let doc = fetch_doc(&app).await;
    let schema = |path: &str, method: &str, status: &str| {
        let answer = &doc["paths"][path][method]["responses"][status];
        validator(&doc, &answer["content"]["application/json"]["schema"])
    };
    let check = schema("/v1/check", "post", "200");
    let batch = schema("/v1/check/batch", "post", "200");
    let error = schema("/v1/check", "post", "400");
    let policy = schema("/v1/quotas/{tenant}", "get", "200");

    let answer = json!({"allowed": true, "limit_id": "per-minute", "limit": 2, "remaining": 1,
        "reset_after_ms": 60000, "retry_after_ms": 0});
    let refused = json!({"error": {"code": "invalid_argument", "message": "bad", "field": "cost"}});
    let results = json!({"results": [answer, refused]});
    let record = json!({"tenant": "acme", "limits": [{"id": "per-minute", "max": 2, "window": "1m"}],
        "consistency": "cached", "mode": "enforce", "on_store_failure": "local",
        "updated_at": "2026-01-01T00:00:00Z", "version": 1});
    for (validator, good) in [
        (&check, &answer),
        (&error, &refused),
        (&batch, &results),
        (&policy, &record),
    ] {
        assert_eq!(errors(validator, good), Vec::<String>::new(), "{good}");
    }

    for (what, validator, bad) in [
        (
            "wrong type",
            &check,
            edited(&answer, "/allowed", Some(json!("yes"))),
        ),
        (
            "required missing",
            &check,
            edited(&answer, "/allowed", None),
        ),
        (
            "undocumented field",
            &check,
            edited(&answer, "/extra", Some(json!(1))),
        ),
        (
            "below minimum",
            &check,
            edited(&answer, "/limit", Some(json!(0))),
        ),
        (
            "not the pattern",
            &check,
            edited(&answer, "/limit_id", Some(json!("a b"))),
        ),
        (
            "a fraction",
            &check,
            edited(&answer, "/remaining", Some(json!(1.0))),
        ),
        (
            "not in enum",
            &error,
            edited(&refused, "/error/code", Some(json!("oops"))),
        ),
        (
            "in no oneOf",
            &batch,
            edited(&results, "/results/0/allowed", Some(json!(1))),
        ),
        (
            "below minItems",
            &policy,
            edited(&record, "/limits", Some(json!([]))),
        ),
    ] {
        assert!(!errors(validator, &bad).is_empty(), "{what}: {bad} passed");
    }
}

/// `v` with the member at `pointer` set to `to`, or removed.
fn edited(v: &Value, pointer: &str, to: Option<Value>) -> Value {
    let mut v = v.clone();
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = v.pointer_mut(parent).unwrap();
    match to {
        Some(x) => parent[key] = x,
        None => {
            parent.as_object_mut().unwrap().remove(key);
        }
    }
    v
}
