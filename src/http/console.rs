//! The web console at `/console`: static files compiled into the binary (no CDN, no separate
//! web server, works offline), served with a strict Content-Security-Policy. The pages only call
//! the public API with the token the user signs in with, so the console can do nothing that
//! token cannot. The files live in `console/` (uPlot vendored there from npm, with its licence).

use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};

use super::error::ApiError;

/// Scripts and styles from this origin only, no inline script or style element, API calls to
/// this origin only, never framed.
/// Trusted Types: the browser refuses any string sent to an HTML sink (`innerHTML` and the like),
/// which the console never uses.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'; require-trusted-types-for 'script'";

/// (path under /console/, content type, bytes).
const FILES: &[(&str, &str, &[u8])] = &[
    (
        "",
        "text/html; charset=utf-8",
        include_bytes!("../../console/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../console/app.js"),
    ),
    (
        "policy.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../console/policy.js"),
    ),
    (
        "support.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../console/support.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../../console/app.css"),
    ),
    (
        "vendor/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../console/vendor/uPlot.iife.min.js"),
    ),
    (
        "vendor/uPlot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("../../console/vendor/uPlot.min.css"),
    ),
    (
        "vendor/uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_bytes!("../../console/vendor/uPlot.LICENSE"),
    ),
];

/// Registers `/console` (a redirect to `/console/`) and `/console/{file}`.
pub fn register(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/console",
        web::get().to(|| async {
            HttpResponse::PermanentRedirect()
                .insert_header((header::LOCATION, "/console/"))
                .finish()
        }),
    )
    .route("/console/{file:.*}", web::get().to(file));
}

async fn file(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let name = req.match_info().get("file").unwrap_or("");
    let (_, ctype, bytes) = FILES
        .iter()
        .find(|(n, _, _)| *n == name)
        .ok_or_else(|| ApiError::NotFound("no such console file".into()))?;
    let mut res = HttpResponse::Ok();
    res.insert_header((header::CONTENT_TYPE, HeaderValue::from_static(ctype)))
        .insert_header((header::CONTENT_SECURITY_POLICY, CSP))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        // The files change with the binary: revalidate, never serve a stale page.
        .insert_header((header::CACHE_CONTROL, "no-cache"));
    Ok(res.body(*bytes))
}
