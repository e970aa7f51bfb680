//! How bytes a run made leave the server: always as a download that no browser renders in
//! the server's origin. Signed links (`/files/…`) and the web UI's download routes share it,
//! so an HTML or SVG a script wrote can never run as the server's page.

use axum::http::{HeaderMap, HeaderValue, header};

/// `Content-Disposition: attachment` for a file named `path` (its last part): a plain ASCII
/// `filename` for old clients and the exact name, percent-encoded, as `filename*`.
pub(crate) fn attachment(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    let plain: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let plain = if plain.is_empty() {
        "download".into()
    } else {
        plain
    };
    format!(
        "attachment; filename=\"{plain}\"; filename*=UTF-8''{}",
        snakebox_engine::encode_artifact_path(name).replace('/', "%2F")
    )
}

/// Sets the headers of a download of the file `name`, of type `content_type`: an attachment,
/// not sniffed, in a CSP sandbox with nothing allowed, not cached, no referrer.
pub(crate) fn attachment_headers(headers: &mut HeaderMap, name: &str, content_type: &str) {
    let content_type = HeaderValue::from_str(content_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let disposition =
        HeaderValue::from_str(&attachment(name)).unwrap_or(HeaderValue::from_static("attachment"));
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(header::CONTENT_DISPOSITION, disposition);
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_and_exact() {
        assert_eq!(
            attachment("out/\"x\".svg"),
            "attachment; filename=\"_x_.svg\"; filename*=UTF-8''%22x%22.svg"
        );
        assert_eq!(
            attachment("résumé.pdf"),
            "attachment; filename=\"r_sum_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf"
        );
        assert!(attachment("").starts_with("attachment; filename=\"download\""));
    }

    #[test]
    fn downloads_are_never_rendered() {
        let mut headers = HeaderMap::new();
        attachment_headers(&mut headers, "page.html", "text/html");
        assert_eq!(headers[header::CONTENT_TYPE], "text/html");
        assert!(
            headers[header::CONTENT_DISPOSITION]
                .to_str()
                .unwrap()
                .starts_with("attachment;")
        );
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(
            headers[header::CONTENT_SECURITY_POLICY],
            "sandbox; default-src 'none'"
        );
    }
}
