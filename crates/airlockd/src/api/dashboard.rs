//! The dashboard: one static, read-only page. It holds no data; it reads the API with the key
//! it is given (in the URL fragment `#key=...`, which browsers never send to the server, then
//! kept in the tab's sessionStorage), so it shows exactly what that key may see.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("dashboard.html");

pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
        .into_response()
}
