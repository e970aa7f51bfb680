//! Grant tokens: a front's word to one agent that one call is for one tenant (and, for a
//! session's calls, one session), valid for at most a minute and once.
//!
//! A token is a JWT signed with EdDSA (Ed25519): the front holds the private key
//! ([`FrontKey`], `front.key`), every agent the public one ([`AgentCheck`], `front.pub`), both
//! made by `snakebox keys front-keypair` ([`write_keypair`]). An agent accepts a token only
//! when its signature is the front's, its audience is [`AUDIENCE`], it names this agent, it
//! is within its lifetime (at most [`MAX_LIFETIME`] long, with [`CLOCK_SKEW`] allowed between
//! hosts) and its id was not seen before (replay protection: ids are kept until their token
//! expires). Anything else is refused with what was wrong and how to fix it. Keys are read
//! from files, never from the command line; a private key file readable by anyone but its
//! owner is refused.

use std::collections::{BTreeSet, HashSet};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand_core::{OsRng, RngCore as _};
use serde::{Deserialize, Serialize};

/// The audience of every grant token: an agent of snakebox.
pub const AUDIENCE: &str = "snakebox-agent";
/// The longest a token may be valid: what the issue allows, and long enough for a front to
/// sign, send and an agent to check, with the clocks of two hosts apart by [`CLOCK_SKEW`].
pub const MAX_LIFETIME: Duration = Duration::from_secs(60);
/// How far apart a front's and an agent's clocks may be.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5);
/// The front's private key, in the directory `snakebox keys front-keypair --out` writes.
pub const PRIVATE_KEY_FILE: &str = "front.key";
/// The agents' copy of the front's public key, beside it.
pub const PUBLIC_KEY_FILE: &str = "front.pub";
/// Token ids an agent remembers at once (each until its token expires): at most a minute's
/// worth of calls. Past it, new tokens are refused until old ones expire, rather than replay
/// protection silently lapsing.
const MAX_REMEMBERED: usize = 1_000_000;

/// What a grant token says (its JWT claims).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Always [`AUDIENCE`].
    pub aud: String,
    /// The agent it is for: the name the agent was started with.
    pub agent: String,
    /// The tenant the call is for.
    pub tenant: String,
    /// The session the call acts on, for a session's calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Issued at (Unix seconds).
    pub iat: u64,
    /// Expires at (Unix seconds).
    pub exp: u64,
    /// Its id (128 random bits, hex): accepted once.
    pub jti: String,
}

/// Why a key or a token was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// A key file could not be read or written.
    #[error("Could not {action}: {cause}")]
    KeyFile {
        /// What was being done (naming the file where `cause` does not).
        action: String,
        /// The file (its path is in `cause` too, for the message).
        path: PathBuf,
        /// Why (in the message: the one place it is said).
        cause: std::io::Error,
    },
    /// A key file does not hold an Ed25519 key in PEM.
    #[error("{} is not an Ed25519 {what} key in PEM: {reason}", path.display())]
    KeyFormat {
        /// The file.
        path: PathBuf,
        /// `private` or `public`.
        what: &'static str,
        /// What the parser said.
        reason: String,
    },
    /// The private key file may be read by others than its owner.
    #[error("{} may be read by others than its owner (mode {mode:o})", path.display())]
    KeyReadableByOthers {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// `front-keypair` would replace a key.
    #[error("{} exists already", path.display())]
    KeyExists {
        /// The file.
        path: PathBuf,
    },
    /// A token was asked for with a lifetime longer than [`MAX_LIFETIME`] (or none).
    #[error("A grant token may be valid for 1 to {} s, not {} ms", MAX_LIFETIME.as_secs(), .0.as_millis())]
    Lifetime(Duration),
    /// Not a token this agent can read, or not signed by the front's key.
    #[error("The grant token is not valid: {0}")]
    Invalid(String),
    /// Signed by the front, but for another audience.
    #[error("The grant token is not for a snakebox agent (audience `{0}`)")]
    Audience(String),
    /// Signed by the front, but for another agent.
    #[error("The grant token is for agent `{for_agent}`, and this is agent `{this_agent}`")]
    OtherAgent {
        /// The agent it names.
        for_agent: String,
        /// This agent.
        this_agent: String,
    },
    /// Its time has passed.
    #[error("The grant token expired {0} s ago")]
    Expired(u64),
    /// Issued in the future (beyond the allowed clock skew).
    #[error("The grant token was issued {0} s in the future")]
    Future(u64),
    /// Valid for longer than [`MAX_LIFETIME`].
    #[error("The grant token is valid for {0} s, longer than the {max} s an agent accepts", max = MAX_LIFETIME.as_secs())]
    TooLong(u64),
    /// Its id was seen before.
    #[error("The grant token was used before")]
    Replayed,
    /// The agent remembers as many ids as it may.
    #[error(
        "This agent has accepted {MAX_REMEMBERED} grant tokens in the last minute, the most it remembers"
    )]
    Busy,
}

impl TokenError {
    /// How to fix it.
    #[must_use]
    pub fn hint(&self) -> &'static str {
        match self {
            TokenError::KeyFile { .. } => {
                "check the path and this user's permissions on it (`snakebox keys front-keypair --out DIR` makes both files)"
            }
            TokenError::KeyFormat { .. } => {
                "pass the front.key (front) or front.pub (agent) that `snakebox keys front-keypair` wrote"
            }
            TokenError::KeyReadableByOthers { .. } => {
                "make it readable by its owner only: chmod 600 FILE (a Kubernetes Secret: defaultMode 0400)"
            }
            TokenError::KeyExists { .. } => {
                "keep the existing pair, or remove both files (every agent then needs the new front.pub), or pick another --out"
            }
            TokenError::Lifetime(_) => "ask for a lifetime of at most 60 s",
            TokenError::Invalid(_) | TokenError::Audience(_) | TokenError::OtherAgent { .. } => {
                "agents accept only calls a front signed for them: call the front (`snakebox serve --http`), and give every agent the public key of the front's key pair (--front-public-key)"
            }
            TokenError::Expired(_) | TokenError::Future(_) | TokenError::TooLong(_) => {
                "tokens live for at most a minute: check that the front's and the agent's clocks agree (NTP)"
            }
            TokenError::Replayed => {
                "a token is good for one call: the front signs a new one for each"
            }
            TokenError::Busy => "retry in a few seconds, or spread calls over more agents",
        }
    }
}

/// The front's signing key.
pub struct FrontKey {
    key: EncodingKey,
}

impl std::fmt::Debug for FrontKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrontKey(..)")
    }
}

impl FrontKey {
    /// The private key in `path` (PKCS#8 PEM), which only its owner may read.
    ///
    /// # Errors
    /// When it cannot be read, may be read by others, or is not an Ed25519 private key.
    pub fn load(path: &Path) -> Result<FrontKey, TokenError> {
        let read_failed = |cause| TokenError::KeyFile {
            action: "read the front's private key".into(),
            path: path.to_path_buf(),
            cause,
        };
        let mode = fs_err::metadata(path)
            .map_err(read_failed)?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(TokenError::KeyReadableByOthers {
                path: path.to_path_buf(),
                mode: mode & 0o777,
            });
        }
        let pem = fs_err::read(path).map_err(read_failed)?;
        FrontKey::from_pem(&pem).map_err(|reason| TokenError::KeyFormat {
            path: path.to_path_buf(),
            what: "private",
            reason,
        })
    }

    /// The private key in `pem`.
    ///
    /// # Errors
    /// What the parser said, when it is not an Ed25519 private key in PKCS#8 PEM.
    pub fn from_pem(pem: &[u8]) -> Result<FrontKey, String> {
        // jsonwebtoken reads any PEM as a key of the family asked for; a signature shows
        // whether it is one.
        let key = EncodingKey::from_ed_pem(pem).map_err(|err| err.to_string())?;
        let probe = FrontKey { key };
        probe
            .sign_grant(&Grant {
                aud: AUDIENCE.into(),
                agent: String::new(),
                tenant: String::new(),
                session: None,
                iat: 0,
                exp: 0,
                jti: String::new(),
            })
            .map_err(|err| err.to_string())?;
        Ok(probe)
    }

    /// A token for one call of `tenant` (on `session`, for a session's calls) to `agent`,
    /// valid for `lifetime` from `now` and once.
    ///
    /// # Errors
    /// When `lifetime` is zero or longer than [`MAX_LIFETIME`].
    pub fn sign(
        &self,
        agent: &str,
        tenant: &str,
        session: Option<&str>,
        lifetime: Duration,
        now: SystemTime,
    ) -> Result<String, TokenError> {
        if lifetime.is_zero() || lifetime > MAX_LIFETIME {
            return Err(TokenError::Lifetime(lifetime));
        }
        let iat = unix_secs(now);
        let mut id = [0_u8; 16];
        OsRng.fill_bytes(&mut id);
        self.sign_grant(&Grant {
            aud: AUDIENCE.into(),
            agent: agent.into(),
            tenant: tenant.into(),
            session: session.map(Into::into),
            iat,
            exp: iat + lifetime.as_secs().max(1),
            jti: id.iter().map(|b| format!("{b:02x}")).collect(),
        })
    }

    fn sign_grant(&self, grant: &Grant) -> Result<String, TokenError> {
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), grant, &self.key)
            .map_err(|err| TokenError::Invalid(err.to_string()))
    }
}

/// What an agent checks tokens with: the front's public key, its own name, and the ids of
/// the tokens it accepted that have not expired yet.
pub struct AgentCheck {
    key: DecodingKey,
    agent: String,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for AgentCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentCheck")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// Accepted token ids, each until its token expires.
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    /// (expiry, id), oldest first: what to forget first.
    by_expiry: BTreeSet<(u64, String)>,
}

impl Seen {
    /// Forget the ids of tokens that expired before `now` (and so are refused anyway).
    fn forget_expired(&mut self, now: u64) {
        while let Some(first) = self.by_expiry.first() {
            if first.0 + CLOCK_SKEW.as_secs() >= now {
                break;
            }
            if let Some((_, id)) = self.by_expiry.pop_first() {
                self.ids.remove(&id);
            }
        }
    }
}

impl AgentCheck {
    /// The front's public key in `path` (SPKI PEM), for the agent named `agent`.
    ///
    /// # Errors
    /// When it cannot be read or is not an Ed25519 public key.
    pub fn load(path: &Path, agent: &str) -> Result<AgentCheck, TokenError> {
        let pem = fs_err::read(path).map_err(|cause| TokenError::KeyFile {
            action: "read the front's public key".into(),
            path: path.to_path_buf(),
            cause,
        })?;
        AgentCheck::from_pem(&pem, agent).map_err(|reason| TokenError::KeyFormat {
            path: path.to_path_buf(),
            what: "public",
            reason,
        })
    }

    /// The front's public key in `pem`, for the agent named `agent`.
    ///
    /// # Errors
    /// What the parser said, when it is not an Ed25519 public key in PEM.
    pub fn from_pem(pem: &[u8], agent: &str) -> Result<AgentCheck, String> {
        let text = std::str::from_utf8(pem).map_err(|err| err.to_string())?;
        if !text.contains("-----BEGIN PUBLIC KEY-----") {
            return Err("no `BEGIN PUBLIC KEY` block (a private key is not accepted here)".into());
        }
        let key = DecodingKey::from_ed_pem(pem).map_err(|err| err.to_string())?;
        Ok(AgentCheck {
            key,
            agent: agent.into(),
            seen: Mutex::new(Seen::default()),
        })
    }

    /// This agent's name.
    #[must_use]
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The grant `token` carries, when the front signed it for this agent, it is within its
    /// lifetime at `now`, and it was not used before (it is used now).
    ///
    /// # Errors
    /// Why it is refused (see [`TokenError`]).
    pub fn check(&self, token: &str, now: SystemTime) -> Result<Grant, TokenError> {
        let mut validation = Validation::new(Algorithm::EdDSA);
        // Time and audience are checked below, against `now` and with our own messages.
        validation.validate_exp = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let grant = jsonwebtoken::decode::<Grant>(token, &self.key, &validation)
            .map_err(|err| TokenError::Invalid(err.to_string()))?
            .claims;
        if grant.aud != AUDIENCE {
            return Err(TokenError::Audience(grant.aud));
        }
        if grant.agent != self.agent {
            return Err(TokenError::OtherAgent {
                for_agent: grant.agent,
                this_agent: self.agent.clone(),
            });
        }
        let now = unix_secs(now);
        let skew = CLOCK_SKEW.as_secs();
        if grant.exp.saturating_sub(grant.iat) > MAX_LIFETIME.as_secs() {
            return Err(TokenError::TooLong(grant.exp.saturating_sub(grant.iat)));
        }
        if grant.exp + skew < now {
            return Err(TokenError::Expired(now - grant.exp));
        }
        if grant.iat > now + skew {
            return Err(TokenError::Future(grant.iat - now));
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.forget_expired(now);
        if seen.ids.contains(&grant.jti) {
            return Err(TokenError::Replayed);
        }
        if seen.ids.len() >= MAX_REMEMBERED {
            return Err(TokenError::Busy);
        }
        seen.ids.insert(grant.jti.clone());
        seen.by_expiry.insert((grant.exp, grant.jti.clone()));
        Ok(grant)
    }
}

/// Make a new key pair for a front and its agents in `dir` (made if missing, mode 0700):
/// [`PRIVATE_KEY_FILE`] (mode 0600) for the front, [`PUBLIC_KEY_FILE`] (0644) for every agent.
/// Returns the two paths.
///
/// # Errors
/// When either file exists (nothing is replaced) or cannot be written.
pub fn write_keypair(dir: &Path) -> Result<(PathBuf, PathBuf), TokenError> {
    let private = dir.join(PRIVATE_KEY_FILE);
    let public = dir.join(PUBLIC_KEY_FILE);
    for path in [&private, &public] {
        if path.exists() {
            return Err(TokenError::KeyExists { path: path.clone() });
        }
    }
    let io = |action: &str, path: &Path| {
        let path = path.to_path_buf();
        let action = format!("{action} {}", path.display());
        move |cause| TokenError::KeyFile {
            action,
            path,
            cause,
        }
    };
    if !dir.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("make the directory", dir))?;
    }
    let key = SigningKey::generate(&mut OsRng);
    let format = |err: String| TokenError::KeyFormat {
        path: private.clone(),
        what: "private",
        reason: err,
    };
    let private_pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|err| format(err.to_string()))?;
    let public_pem = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|err| format(err.to_string()))?;
    write_new(&private, private_pem.as_bytes(), 0o600).map_err(io("write", &private))?;
    write_new(&public, public_pem.as_bytes(), 0o644).map_err(io("write", &public))?;
    Ok((private, public))
}

/// Write `bytes` to a new file `path` with `mode` (never replacing one).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    // The process's umask may have narrowed the public file: it is for others to read.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

fn unix_secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pair() -> (tempfile::TempDir, FrontKey, AgentCheck) {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = write_keypair(&dir.path().join("keys")).unwrap();
        let front = FrontKey::load(&private).unwrap();
        let agent = AgentCheck::load(&public, "agent-1").unwrap();
        (dir, front, agent)
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_token_the_front_signed_for_this_agent_is_accepted_once() {
        let (_dir, front, agent) = pair();
        let now = SystemTime::now();
        let token = front
            .sign("agent-1", "acme", Some("s-1"), Duration::from_secs(30), now)
            .unwrap();
        let grant = agent.check(&token, now).unwrap();
        assert_eq!(grant.tenant, "acme");
        assert_eq!(grant.session.as_deref(), Some("s-1"));
        assert_eq!(grant.agent, "agent-1");
        assert_eq!(grant.exp - grant.iat, 30);
        assert!(matches!(
            agent.check(&token, now),
            Err(TokenError::Replayed)
        ));
        // Another token for the same call is a new one.
        let again = front.sign("agent-1", "acme", None, MINUTE, now).unwrap();
        assert_eq!(agent.check(&again, now).unwrap().session, None);
    }

    #[test]
    fn tokens_for_another_agent_or_out_of_their_time_are_refused() {
        let (_dir, front, agent) = pair();
        let now = SystemTime::now();
        let other = front.sign("agent-2", "acme", None, MINUTE, now).unwrap();
        let err = agent.check(&other, now).unwrap_err();
        assert!(matches!(err, TokenError::OtherAgent { .. }), "{err}");
        assert!(err.to_string().contains("agent-2") && err.to_string().contains("agent-1"));

        let old = front
            .sign(
                "agent-1",
                "acme",
                None,
                MINUTE,
                now - Duration::from_secs(120),
            )
            .unwrap();
        assert!(matches!(
            agent.check(&old, now),
            Err(TokenError::Expired(60))
        ));
        // Within the clock skew, a token a little past its time still holds.
        let just = front
            .sign(
                "agent-1",
                "acme",
                None,
                MINUTE,
                now - Duration::from_secs(63),
            )
            .unwrap();
        assert!(agent.check(&just, now).is_ok());

        let future = front
            .sign(
                "agent-1",
                "acme",
                None,
                MINUTE,
                now + Duration::from_secs(30),
            )
            .unwrap();
        assert!(matches!(
            agent.check(&future, now),
            Err(TokenError::Future(30))
        ));
    }

    #[test]
    fn a_front_never_signs_past_a_minute_and_an_agent_never_accepts_it() {
        let (dir, front, agent) = pair();
        let now = SystemTime::now();
        assert!(matches!(
            front.sign("agent-1", "acme", None, Duration::from_secs(61), now),
            Err(TokenError::Lifetime(_))
        ));
        assert!(matches!(
            front.sign("agent-1", "acme", None, Duration::ZERO, now),
            Err(TokenError::Lifetime(_))
        ));
        // A token made with the same key by other means, valid for an hour.
        let pem = fs_err::read(dir.path().join("keys").join(PRIVATE_KEY_FILE)).unwrap();
        let key = EncodingKey::from_ed_pem(&pem).unwrap();
        let iat = unix_secs(now);
        let long = Grant {
            aud: AUDIENCE.into(),
            agent: "agent-1".into(),
            tenant: "acme".into(),
            session: None,
            iat,
            exp: iat + 3600,
            jti: "x".into(),
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &long, &key).unwrap();
        assert!(matches!(
            agent.check(&token, now),
            Err(TokenError::TooLong(3600))
        ));
        let wrong_audience = Grant {
            aud: "someone-else".into(),
            exp: iat + 10,
            ..long
        };
        let token =
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &wrong_audience, &key).unwrap();
        assert!(matches!(
            agent.check(&token, now),
            Err(TokenError::Audience(_))
        ));
    }

    #[test]
    fn unsigned_forged_or_foreign_tokens_are_refused() {
        let (_dir, front, agent) = pair();
        let now = SystemTime::now();
        let token = front.sign("agent-1", "acme", None, MINUTE, now).unwrap();
        // Another tenant written into a signed token: the signature no longer holds.
        let mut parts: Vec<String> = token.split('.').map(String::from).collect();
        let body = String::from_utf8(base64_url_decode(&parts[1]))
            .unwrap()
            .replace("acme", "evil");
        parts[1] = base64_url_encode(body.as_bytes());
        let forged = parts.join(".");
        assert!(matches!(
            agent.check(&forged, now),
            Err(TokenError::Invalid(_))
        ));
        // No signature at all (`alg: none`).
        let none_header = base64_url_encode(br#"{"alg":"none","typ":"JWT"}"#);
        let unsigned = format!("{none_header}.{}.", parts[1]);
        assert!(matches!(
            agent.check(&unsigned, now),
            Err(TokenError::Invalid(_))
        ));
        // Signed by another front's key.
        let (_other_dir, other_front, _) = pair();
        let foreign = other_front
            .sign("agent-1", "acme", None, MINUTE, now)
            .unwrap();
        assert!(matches!(
            agent.check(&foreign, now),
            Err(TokenError::Invalid(_))
        ));
        assert!(matches!(
            agent.check("not a token", now),
            Err(TokenError::Invalid(_))
        ));
        // Nothing refused was remembered: the real token is still good once.
        assert!(agent.check(&token, now).is_ok());
    }

    #[test]
    fn keys_are_written_once_and_a_private_key_others_may_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let (private, public) = write_keypair(&keys).unwrap();
        let mode = |p: &Path| fs_err::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&private), 0o600);
        assert_eq!(mode(&public), 0o644);
        assert_eq!(mode(&keys), 0o700);
        let before = fs_err::read(&private).unwrap();
        let err = write_keypair(&keys).unwrap_err();
        assert!(matches!(err, TokenError::KeyExists { .. }), "{err}");
        assert_eq!(
            fs_err::read(&private).unwrap(),
            before,
            "a key was replaced"
        );

        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = FrontKey::load(&private).unwrap_err();
        assert!(
            matches!(err, TokenError::KeyReadableByOthers { mode: 0o644, .. }),
            "{err}"
        );
        assert!(err.hint().contains("chmod 600"));

        // Each key where the other belongs.
        let err = AgentCheck::load(&private, "a").unwrap_err();
        assert!(
            matches!(err, TokenError::KeyFormat { what: "public", .. }),
            "{err}"
        );
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = FrontKey::load(&public).unwrap_err();
        assert!(
            matches!(
                err,
                TokenError::KeyFormat {
                    what: "private",
                    ..
                }
            ),
            "{err}"
        );
        let err = FrontKey::load(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, TokenError::KeyFile { .. }), "{err}");
    }

    #[test]
    fn an_agent_forgets_the_ids_of_expired_tokens() {
        let (_dir, front, agent) = pair();
        let then = SystemTime::now() - Duration::from_secs(600);
        for _ in 0..3 {
            let token = front.sign("agent-1", "acme", None, MINUTE, then).unwrap();
            agent.check(&token, then).unwrap();
        }
        assert_eq!(agent.seen.lock().unwrap().ids.len(), 3);
        let now = SystemTime::now();
        let token = front.sign("agent-1", "acme", None, MINUTE, now).unwrap();
        agent.check(&token, now).unwrap();
        let seen = agent.seen.lock().unwrap();
        assert_eq!((seen.ids.len(), seen.by_expiry.len()), (1, 1));
    }

    fn base64_url_decode(text: &str) -> Vec<u8> {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .unwrap()
    }

    fn base64_url_encode(bytes: &[u8]) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }
}
