//! How bytes a run made leave the server: always as a download that no browser renders in
//! the server's origin. Signed links (`/files/…`) and the web UI's download routes share it,
//! so an HTML or SVG a script wrote can never run as the server's page. The one exception is
//! a raster image behind a signed link ([`INLINE_IMAGES`]): shown in the browser, as
//! python-mcp-sandbox's links are, since a PNG, JPEG, GIF or WebP is a picture and nothing
//! else (not sniffed, in a CSP sandbox, like every download).

use axum::http::{HeaderMap, HeaderValue, header};

/// Raster image types a browser shows as a picture and never runs (not SVG: a document that
/// can hold script): a signed link serves these `inline`.
pub(crate) const INLINE_IMAGES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// `Content-Disposition: attachment` for a file named `path` (its last part): a plain ASCII
/// `filename` for old clients and the exact name, percent-encoded, as `filename*`.
pub(crate) fn attachment(path: &str) -> String {
    disposition("attachment", path)
}

/// `Content-Disposition: KIND` (`attachment`, `inline`) for a file named `path`.
fn disposition(kind: &str, path: &str) -> String {
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
        "{kind}; filename=\"{plain}\"; filename*=UTF-8''{}",
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

/// [`attachment_headers`], except that a raster image ([`INLINE_IMAGES`]) is shown `inline`:
/// the headers of a signed link's answer.
pub(crate) fn link_headers(headers: &mut HeaderMap, name: &str, content_type: &str) {
    attachment_headers(headers, name, content_type);
    if INLINE_IMAGES.contains(&content_type)
        && let Ok(inline) = HeaderValue::from_str(&disposition("inline", name))
    {
        headers.insert(header::CONTENT_DISPOSITION, inline);
    }
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

    #[test]
    fn a_link_shows_a_raster_image_and_downloads_everything_else() {
        for (name, mime, shown) in [
            ("plot.png", "image/png", true),
            ("photo.jpg", "image/jpeg", true),
            ("anim.gif", "image/gif", true),
            ("pic.webp", "image/webp", true),
            ("chart.svg", "image/svg+xml", false),
            ("page.html", "text/html", false),
            ("data.csv", "text/csv", false),
        ] {
            let mut headers = HeaderMap::new();
            link_headers(&mut headers, name, mime);
            let disposition = headers[header::CONTENT_DISPOSITION].to_str().unwrap();
            let kind = if shown { "inline;" } else { "attachment;" };
            assert!(disposition.starts_with(kind), "{name}: {disposition}");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{name}");
            assert_eq!(
                headers[header::CONTENT_SECURITY_POLICY],
                "sandbox; default-src 'none'",
                "{name}"
            );
        }
    }
}
