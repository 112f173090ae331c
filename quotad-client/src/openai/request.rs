//! What [`super::TokenBudgetLayer`] reads from a request body: the estimate to reserve, and
//! whether a stream should be asked to report its usage.

use bytes::Bytes;
use serde_json::Value;

/// quotad's largest cost: an estimate is never above it.
const MAX_COST: u64 = 1_000_000_000;

/// How the prompt's part of an estimate is counted (the completion's part is the request's
/// `max_completion_tokens` or `max_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptEstimate {
    /// The same number of tokens for every request.
    Fixed(u64),
    /// The request body's length in bytes over this many, rounded up. 4 bytes a token is the
    /// usual rule for English text; counting the whole body (the JSON around the messages, the
    /// other fields) makes it err high, which a settle gives back.
    BytesPerToken(u64),
}

impl PromptEstimate {
    fn tokens(self, body: &[u8]) -> u64 {
        match self {
            PromptEstimate::Fixed(n) => n,
            PromptEstimate::BytesPerToken(n) => (body.len() as u64).div_ceil(n.max(1)),
        }
    }
}

/// A request as the layer sends it on: what to reserve, and its body.
#[derive(Debug, PartialEq)]
pub(super) struct Prepared {
    /// The tokens to reserve.
    pub estimate: u64,
    /// The body to send: the one read, or, for a stream that did not say, the same with
    /// `stream_options.include_usage` set.
    pub body: Bytes,
    /// Whether `body` is not the body read.
    pub rewritten: bool,
}

/// The estimate of a request: the prompt's (`prompt`) plus the completion's, which is
/// `max_completion_tokens` (else `max_tokens`, else `completion`) for each of the `n` choices
/// asked for. A streaming request (`"stream": true`) with no `stream_options.include_usage` is
/// given `"include_usage": true`, so that its last event carries the usage to settle at.
pub(super) fn prepare(body: Bytes, prompt: PromptEstimate, completion: u64) -> Prepared {
    let prompt = prompt.tokens(&body);
    let Ok(Value::Object(mut req)) = serde_json::from_slice::<Value>(&body) else {
        return Prepared {
            estimate: prompt.saturating_add(completion).min(MAX_COST),
            body,
            rewritten: false,
        };
    };
    let asked = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|f| req.get(*f).and_then(Value::as_u64))
        .unwrap_or(completion);
    let choices = req.get("n").and_then(Value::as_u64).unwrap_or(1).max(1);
    let estimate = asked
        .saturating_mul(choices)
        .saturating_add(prompt)
        .min(MAX_COST);
    let streaming = req.get("stream") == Some(&Value::Bool(true));
    let ask_usage = streaming
        && match req.get("stream_options") {
            None => true,
            Some(Value::Object(o)) => !o.contains_key("include_usage"),
            // Not an object: the upstream's error to answer, not the layer's to mend.
            Some(_) => false,
        };
    if !ask_usage {
        // Nothing to change: the bytes read go on as they were.
        return Prepared {
            estimate,
            body,
            rewritten: false,
        };
    }
    let options = req
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Value::Object(o) = options {
        o.insert("include_usage".into(), Value::Bool(true));
    }
    Prepared {
        estimate,
        body: Bytes::from(serde_json::to_vec(&req).unwrap_or_default()),
        rewritten: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn of(v: Value, prompt: PromptEstimate) -> Prepared {
        prepare(Bytes::from(v.to_string()), prompt, 1024)
    }

    #[test]
    fn the_estimate_is_the_prompts_and_the_completions_for_each_choice() {
        let fixed = PromptEstimate::Fixed(100);
        assert_eq!(of(json!({"max_tokens": 50}), fixed).estimate, 150);
        assert_eq!(
            of(
                json!({"max_completion_tokens": 70, "max_tokens": 50}),
                fixed
            )
            .estimate,
            170
        );
        assert_eq!(of(json!({"max_tokens": 50, "n": 3}), fixed).estimate, 250);
        // No max: the configured completion; not JSON at all: the same.
        assert_eq!(of(json!({"model": "m"}), fixed).estimate, 1124);
        assert_eq!(
            prepare(Bytes::from_static(b"not json"), fixed, 1024).estimate,
            1124
        );
        let body = json!({"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        let len = body.to_string().len() as u64;
        assert_eq!(
            of(body, PromptEstimate::BytesPerToken(4)).estimate,
            10 + len.div_ceil(4)
        );
        assert_eq!(
            of(json!({"max_tokens": u64::MAX}), fixed).estimate,
            MAX_COST
        );
    }

    #[test]
    fn a_stream_is_asked_for_its_usage_unless_it_said() {
        let fixed = PromptEstimate::Fixed(0);
        let p = of(json!({"stream": true, "max_tokens": 5}), fixed);
        assert!(p.rewritten);
        let sent: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(sent["stream_options"], json!({"include_usage": true}));
        assert_eq!(sent["max_tokens"], 5);
        // Other stream options are kept.
        let p = of(json!({"stream": true, "stream_options": {"x": 1}}), fixed);
        let sent: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(
            sent["stream_options"],
            json!({"x": 1, "include_usage": true})
        );
        // Said (even no), or not a stream: the bytes go on untouched.
        for body in [
            json!({"stream": true, "stream_options": {"include_usage": false}}),
            json!({"stream": false}),
            json!({"max_tokens": 5}),
        ] {
            let bytes = Bytes::from(body.to_string());
            let p = prepare(bytes.clone(), fixed, 1);
            assert!(!p.rewritten, "{body}");
            assert_eq!(p.body, bytes);
        }
    }
}
