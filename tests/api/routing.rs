//! Paths and methods the server does not have: 404 and 405 in the contract's shape, and a 405's
//! `Allow` naming exactly the methods of its path.

use crate::helpers::*;

#[tokio::test]
async fn unknown_routes_and_wrong_methods_answer_in_the_error_shape() {
    let app = spawn_app().await;
    let r = app.http.get(app.url("/v1/nothing")).send().await.unwrap();
    assert_eq!(allowed_methods(&r), None, "a 404 has no Allow");
    assert_error(r, 404, "not_found").await;
    let r = app.http.get(app.url("/v1/check")).send().await.unwrap();
    assert_error(r, 405, "method_not_allowed").await;
    let r = app.http.delete(app.url("/healthz")).send().await.unwrap();
    assert_error(r, 405, "method_not_allowed").await;
}

/// RFC 9110 §15.5.6: a 405 carries `Allow` with the methods the path does support, for every
/// method it does not (including ones no route anywhere uses), with or without credentials.
#[tokio::test]
async fn a_405_names_the_methods_of_its_path_in_allow() {
    let app = spawn_app().await;
    let routes: [(&str, &[&str]); 8] = [
        ("/v1/check", &["POST"]),
        ("/v1/check/batch", &["POST"]),
        ("/v1/quotas", &["GET"]),
        ("/v1/quotas/acme", &["GET", "PUT", "DELETE"]),
        ("/v1/quotas/acme/clients/k1", &["GET", "PUT", "DELETE"]),
        ("/v1/usage/acme/k1", &["GET"]),
        ("/healthz", &["GET"]),
        ("/v1/openapi.json", &["GET"]),
    ];
    let every = [
        "GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "TRACE", "HEAD", "QUERY",
    ];
    for (path, methods) in routes {
        let want: std::collections::BTreeSet<String> =
            methods.iter().map(|m| m.to_string()).collect();
        for m in every.iter().filter(|m| !methods.contains(m)) {
            for token in [None, Some(ADMIN)] {
                let method = reqwest::Method::from_bytes(m.as_bytes()).unwrap();
                let mut req = app.http.request(method, app.url(path));
                if let Some(t) = token {
                    req = req.bearer_auth(t);
                }
                let r = req.send().await.unwrap();
                assert_eq!(r.status(), 405, "{m} {path}");
                assert_eq!(allowed_methods(&r).as_ref(), Some(&want), "{m} {path}");
                if *m != "HEAD" {
                    assert_error(r, 405, "method_not_allowed").await;
                }
            }
        }
        // An allowed method is not a 405 and carries no Allow.
        let method = reqwest::Method::from_bytes(methods[0].as_bytes()).unwrap();
        let r = app
            .http
            .request(method, app.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_ne!(r.status(), 405, "{} {path}", methods[0]);
        assert_eq!(allowed_methods(&r), None, "{} {path}", methods[0]);
    }
}
