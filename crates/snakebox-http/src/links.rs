//! Signed, expiring download links: `GET /files/{execution_id}/{path}?tenant=…&exp=…&sig=…`.
//!
//! A link is its own credential, so a browser, `curl` or a script downloads an artifact
//! without an API key (and no key ever goes into a URL). `sig` is HMAC-SHA256, under a
//! server secret, of the method, the path, the expiry and the tenant the link was made for;
//! the tenant is then the caller of the artifact store's own lookup, so a link opens only
//! what its tenant owns. The secret is 32 random bytes in `<data>/link-secret-v1` (created
//! 0600 on first use), so links survive a restart; removing the file revokes every link.
//!
//! The checks, in order: the path's shape (an invalid execution id, `..`, an absolute path:
//! 404, as a file that does not exist), the signature (missing or wrong: 403), the expiry
//! (past: 410), then the store (unknown, expired by retention, another tenant's: 404). The
//! file is streamed from disk with `Content-Disposition: attachment`, `nosniff` and
//! `Content-Security-Policy: sandbox`, so nothing a run wrote is ever rendered as a page of
//! this server's origin.

use crate::refusal::refusal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use sha2::Sha256;
use snakebox_engine::{Caller, EngineApi, ErrorKind, OpenArtifact};
use snakebox_server::{DownloadLinks, Downloads};

use crate::authority::BaseUrl;
use crate::edge::RequestAuthority;

/// The secret's file under the data directory.
pub const SECRET_FILE: &str = "link-secret-v1";
/// Bytes of the secret.
const SECRET_BYTES: usize = 32;
/// The route's prefix.
pub const ROUTE_PREFIX: &str = "/files/";
/// How long a link is valid when the settings say nothing (`[http] link_ttl`).
pub const DEFAULT_LINK_TTL: Duration = Duration::from_secs(3600);

/// Why the link secret cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Reading, creating or protecting the file failed.
    #[error("Failed to read or create the download-link secret `{path}`")]
    Io {
        /// The secret's path.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not 32 bytes.
    #[error("The download-link secret `{path}` is {len} bytes, not {SECRET_BYTES}")]
    Malformed {
        /// The secret's path.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
}

impl LinkError {
    /// How to fix it.
    #[must_use]
    pub fn hint(&self) -> String {
        match self {
            LinkError::Io { .. } => {
                "check that the data directory is writable by the server's user".into()
            }
            LinkError::Malformed { path, .. } => format!(
                "remove `{}`; a new secret is made at the next start (links made before stop working)",
                path.display()
            ),
        }
    }
}

/// Signs and checks download links with the server's secret.
#[derive(Clone)]
pub struct LinkSigner {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for LinkSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkSigner { .. }")
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The path of the link to `name` of `execution_id`.
fn link_path(execution_id: &str, name: &str) -> String {
    format!(
        "{ROUTE_PREFIX}{execution_id}/{}",
        snakebox_engine::encode_artifact_path(name)
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

impl LinkSigner {
    /// A signer with this secret.
    #[must_use]
    pub fn with_secret(secret: &[u8; SECRET_BYTES]) -> LinkSigner {
        // HMAC takes a key of any length: this cannot fail.
        let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
        LinkSigner { mac }
    }

    /// The signer of `data_dir`: its secret is read, or made (32 random bytes, 0600) on
    /// first use. Two servers starting at once agree: the secret is written under a temporary
    /// name and linked into place, and the loser reads the winner's.
    ///
    /// # Errors
    /// The file cannot be read or created, or is not 32 bytes.
    pub fn load_or_create(data_dir: &Path) -> Result<LinkSigner, LinkError> {
        use fs_err::os::unix::fs::OpenOptionsExt;
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        let path = data_dir.join(SECRET_FILE);
        let io = |source| LinkError::Io {
            path: path.clone(),
            source,
        };
        if !path.exists() {
            fs_err::create_dir_all(data_dir).map_err(io)?;
            let secret = crate::keys::random_hex(SECRET_BYTES).map_err(io)?;
            let bytes = unhex(&secret).unwrap_or_default();
            let temp = data_dir.join(format!(
                ".{SECRET_FILE}.{}",
                crate::keys::random_hex(8).map_err(io)?
            ));
            let mut file = fs_err::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)
                .map_err(io)?;
            let written = file.write_all(&bytes).and_then(|()| file.sync_all());
            drop(file);
            let linked = written.and_then(|()| std::fs::hard_link(&temp, &path));
            let _ = fs_err::remove_file(&temp);
            match linked {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(io(err)),
            }
        }
        let bytes = fs_err::read(&path).map_err(io)?;
        // Keep it private even if someone loosened it.
        fs_err::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
        let secret: [u8; SECRET_BYTES] =
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| LinkError::Malformed {
                    path: path.clone(),
                    len: bytes.len(),
                })?;
        Ok(LinkSigner::with_secret(&secret))
    }

    /// The MAC of one link: the method, path, expiry and tenant, one per line (the path
    /// last: only it may hold a newline, percent-encoded).
    fn mac_of(&self, path: &str, expires: u64, tenant: &str) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(format!("GET\n{expires}\n{tenant}\n{path}").as_bytes());
        mac
    }

    /// The signature (hex) of the link to `name` of `execution_id` for `tenant`, valid until
    /// `expires` (seconds since the Unix epoch).
    #[must_use]
    pub fn sign(&self, tenant: &str, execution_id: &str, name: &str, expires: u64) -> String {
        hex(&self
            .mac_of(&link_path(execution_id, name), expires, tenant)
            .finalize()
            .into_bytes())
    }

    /// Whether `sig` is the signature of that link (compared in constant time).
    fn verify(
        &self,
        tenant: &str,
        execution_id: &str,
        name: &str,
        expires: u64,
        sig: &str,
    ) -> bool {
        let Some(sig) = unhex(sig) else {
            return false;
        };
        self.mac_of(&link_path(execution_id, name), expires, tenant)
            .verify_slice(&sig)
            .is_ok()
    }

    /// The path and query of a link (without the scheme and host).
    #[must_use]
    pub fn link(&self, tenant: &str, execution_id: &str, name: &str, expires: u64) -> String {
        format!(
            "{}?tenant={tenant}&exp={expires}&sig={}",
            link_path(execution_id, name),
            self.sign(tenant, execution_id, name, expires)
        )
    }
}

/// What the links of one server need: the signer, how long a link lives, and the base URL
/// when the operator fixed one (`--public-url`).
#[derive(Debug, Clone)]
pub(crate) struct Links {
    pub(crate) signer: LinkSigner,
    pub(crate) ttl: Duration,
    /// `--public-url`, parsed.
    pub(crate) public_url: Option<BaseUrl>,
    /// `http://<bound address>`, when no request names a host.
    pub(crate) fallback_base: BaseUrl,
}

/// The links of one request: its base URL fixed.
struct RequestLinks {
    links: Arc<Links>,
    base: String,
}

impl DownloadLinks for RequestLinks {
    fn url(&self, caller: &Caller, execution_id: &str, name: &str) -> Option<String> {
        let expires = now_unix().saturating_add(self.links.ttl.as_secs());
        Some(format!(
            "{}{}",
            self.base,
            self.links
                .signer
                .link(caller.id(), execution_id, name, expires)
        ))
    }
}

/// Put the request's [`Downloads`] in its extensions: links go to `--public-url`, else to
/// the `Host` the client reached as the edge parsed and allowed it ([`RequestAuthority`]:
/// never the header's text), else the bound address.
pub(crate) async fn attach(
    State(links): State<Arc<Links>>,
    mut request: Request,
    next: Next,
) -> Response {
    let base = match &links.public_url {
        Some(url) => url.clone(),
        None => request.extensions().get::<RequestAuthority>().map_or_else(
            || links.fallback_base.clone(),
            |RequestAuthority(authority)| BaseUrl::http(authority.clone()),
        ),
    }
    .to_string();
    request
        .extensions_mut()
        .insert(Downloads(Arc::new(RequestLinks {
            links: Arc::clone(&links),
            base,
        })));
    next.run(request).await
}

/// The query of a link.
#[derive(Debug, Deserialize)]
pub(crate) struct LinkQuery {
    tenant: Option<String>,
    exp: Option<String>,
    sig: Option<String>,
}

/// What to do about a link to a file that is not there.
const NOT_FOUND_HINT: &str = "download links come in execute_python results (`download_url`); artifacts are kept for a limited time";

fn not_found() -> Response {
    refusal(StatusCode::NOT_FOUND, "no such file", NOT_FOUND_HINT)
}

/// Whether `id` can be an execution id (what the artifact store names them by).
fn valid_execution_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Whether `path` is a relative path without `.`/`..` names, empty names or NULs.
fn valid_name(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != ".." && !part.contains('\0'))
}

/// `GET /files/{execution_id}/{path}`.
pub(crate) async fn download(
    State((engine, links)): State<(Arc<dyn EngineApi>, Arc<Links>)>,
    UrlPath((execution_id, path)): UrlPath<(String, String)>,
    query: Result<Query<LinkQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if !valid_execution_id(&execution_id) || !valid_name(&path) {
        return not_found();
    }
    let forbidden = || {
        refusal(
            StatusCode::FORBIDDEN,
            "the download link's signature is missing or wrong",
            "use the link exactly as the result gave it (`download_url`), or run the script again for a new one",
        )
    };
    let Ok(Query(query)) = query else {
        return forbidden();
    };
    let (Some(tenant), Some(exp), Some(sig)) = (query.tenant, query.exp, query.sig) else {
        return forbidden();
    };
    let Ok(expires) = exp.parse::<u64>() else {
        return forbidden();
    };
    if !links
        .signer
        .verify(&tenant, &execution_id, &path, expires, &sig)
    {
        return forbidden();
    }
    if now_unix() > expires {
        return refusal(
            StatusCode::GONE,
            "the download link has expired",
            "read the artifact with resources/read, or run the script again for a new link",
        );
    }
    // Only the server signs, and only for a valid tenant; checked again all the same.
    let Ok(caller) = Caller::tenant(&tenant) else {
        return not_found();
    };
    let request = OpenArtifact {
        execution_id: execution_id.clone(),
        path: path.clone(),
    };
    let opened = match engine.open_artifact(&caller, request).await {
        Ok(opened) => opened,
        // Not found: the store says why (an artifact removed by its own tenant's budget
        // says so; the link names that tenant, so nobody else's state is told).
        // A path that is not one is answered as one that does not exist (a link names no
        // path the server did not sign).
        Err(err) if err.kind == ErrorKind::Invalid => return not_found(),
        Err(err) => {
            let mut refused = crate::refusal::Refusal::from(&err);
            if err.kind == ErrorKind::NotFound {
                if err.hint.is_none() {
                    refused.hint = NOT_FOUND_HINT.into();
                }
            } else {
                tracing::warn!(error = %err.message, "a download failed");
            }
            return refused.into_response();
        }
    };
    let head = opened.head;
    let file_name = head
        .name
        .rsplit('/')
        .next()
        .unwrap_or(&head.name)
        .to_owned();
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(opened.body));
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    crate::download::link_headers(headers, &file_name, &head.mime_type);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(head.size));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_covers_path_expiry_and_tenant() {
        let signer = LinkSigner::with_secret(&[7; SECRET_BYTES]);
        let sig = signer.sign("team-a", "e1", "out/a b.txt", 100);
        assert!(signer.verify("team-a", "e1", "out/a b.txt", 100, &sig));
        assert!(!signer.verify("team-b", "e1", "out/a b.txt", 100, &sig));
        assert!(!signer.verify("team-a", "e2", "out/a b.txt", 100, &sig));
        assert!(!signer.verify("team-a", "e1", "out/a b.tx", 100, &sig));
        assert!(!signer.verify("team-a", "e1", "out/a b.txt", 101, &sig));
        assert!(!signer.verify("team-a", "e1", "out/a b.txt", 100, "zz"));
        let other = LinkSigner::with_secret(&[8; SECRET_BYTES]);
        assert!(!other.verify("team-a", "e1", "out/a b.txt", 100, &sig));
    }

    #[test]
    fn links_encode_names_as_artifact_uris_do() {
        let signer = LinkSigner::with_secret(&[7; SECRET_BYTES]);
        let link = signer.link("t", "e1", "dir/a b?.txt", 5);
        assert!(
            link.starts_with("/files/e1/dir/a%20b%3F.txt?tenant=t&exp=5&sig="),
            "{link}"
        );
    }

    #[test]
    fn names_are_checked_before_anything() {
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a\0b"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_name("a/b.txt"));
        assert!(!valid_execution_id("a/b"));
        assert!(!valid_execution_id(".."));
    }

    #[test]
    fn the_secret_is_made_once_private_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let data = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let first = LinkSigner::load_or_create(data.path()).unwrap_or_else(|err| panic!("{err}"));
        let path = data.path().join(SECRET_FILE);
        let meta = fs_err::metadata(&path).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), SECRET_BYTES as u64);
        let again = LinkSigner::load_or_create(data.path()).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(first.sign("t", "e", "n", 1), again.sign("t", "e", "n", 1));
        fs_err::write(&path, b"short").unwrap_or_else(|err| panic!("{err}"));
        let err = LinkSigner::load_or_create(data.path()).err();
        assert!(
            matches!(err, Some(LinkError::Malformed { len: 5, .. })),
            "{err:?}"
        );
    }
}
