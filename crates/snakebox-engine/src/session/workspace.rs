//! The file tools: `write_file`, `read_file` and `list_files` in a session's workspace.
//!
//! The confinement itself (plain relative names resolved beneath the workspace, never a link
//! followed) is the confined-fs crate's ([`snakebox_fs`]); this module adds the sessions' checks (size, encoding,
//! the disk cap, the session's lock while writing) and the tools' errors and hints.

use crate::Caller;
use snakebox_fs::{FsError, RelativePath};
use snakebox_sandbox::Identity;

use super::SessionService;
use super::{
    FileContent, FileList, FileWritten, MAX_FILE_BYTES, MAX_LIST_ENTRIES, files, no_session,
};
use crate::files::{decode_base64, encode_base64};
use crate::{EngineError, ErrorKind};

impl SessionService {
    /// Write a file into a session's workspace (parents created).
    ///
    /// # Errors
    /// No such session, a path outside the workspace, too large, disk full.
    pub(crate) async fn write_file(
        &self,
        caller: &Caller,
        session_id: &str,
        path: &str,
        content: &str,
        encoding: Option<&str>,
    ) -> Result<FileWritten, EngineError> {
        let manager = self.session_manager()?;
        let row = manager.row(caller, session_id)?;
        let rel = RelativePath::parse_entry(path).map_err(|err| file_error(err.into()))?;
        let content = match encoding.map(str::to_ascii_lowercase).as_deref() {
            None | Some("utf-8" | "utf8" | "text") => content.as_bytes().to_vec(),
            Some("base64") => decode_base64(content).map_err(|_| EngineError {
                kind: ErrorKind::Invalid,
                message: "The content is not valid base64".into(),
                hint: Some("encode binary content with standard base64 (RFC 4648)".into()),
            })?,
            Some(other) => {
                return Err(EngineError {
                    kind: ErrorKind::Invalid,
                    message: format!("Unknown encoding `{other}`"),
                    hint: Some("use \"utf-8\" (default) or \"base64\"".into()),
                });
            }
        };
        if content.len() as u64 > MAX_FILE_BYTES {
            return Err(EngineError {
                kind: ErrorKind::Quota,
                message: format!(
                    "The content is {} bytes, more than the limit of {MAX_FILE_BYTES} bytes",
                    content.len()
                ),
                hint: Some(
                    "write large data in pieces, or download it from the session's code".into(),
                ),
            });
        }
        manager.check_disk(&row.owner)?;
        let owner = self.session_sandbox()?.host_ids(Identity::Untrusted);
        let work = manager.paths(&row)?.work;
        let slot = manager.slot(&row);
        let mut state = slot.state.lock().await;
        if state.deleted {
            return Err(no_session(session_id));
        }
        // Not a cell's file: the next cell's baseline must include it.
        state.known_files = None;
        let size = self
            .calls
            .on_host(caller, "write the file", move || {
                snakebox_fs::write(&work, &rel, &content, owner)
            })
            .await?
            .map_err(file_error)?;
        drop(state);
        manager.used(&self.calls, caller, &row.id, false).await;
        Ok(FileWritten {
            session_id: row.id,
            path: path.to_owned(),
            size,
        })
    }

    /// Read a file from a session's workspace.
    ///
    /// # Errors
    /// No such session or file, a path outside the workspace, a symlink, too large.
    pub(crate) async fn read_file(
        &self,
        caller: &Caller,
        session_id: &str,
        path: &str,
    ) -> Result<FileContent, EngineError> {
        let manager = self.session_manager()?;
        let row = manager.row(caller, session_id)?;
        let work = manager.paths(&row)?.work;
        let rel = RelativePath::parse_entry(path).map_err(|err| file_error(err.into()))?;
        let data = self
            .calls
            .on_host(caller, "read the file", move || {
                snakebox_fs::read(&work, &rel, MAX_FILE_BYTES)
            })
            .await?
            .map_err(file_error)?;
        let size = data.len() as u64;
        let (encoding, content) = match String::from_utf8(data) {
            Ok(text) => ("utf-8", text),
            Err(err) => ("base64", encode_base64(err.as_bytes())),
        };
        Ok(FileContent {
            session_id: row.id,
            path: path.to_owned(),
            size,
            encoding: encoding.into(),
            content,
        })
    }

    /// List a directory of a session's workspace.
    ///
    /// # Errors
    /// No such session or directory, a path outside the workspace.
    pub(crate) async fn list_files(
        &self,
        caller: &Caller,
        session_id: &str,
        path: &str,
        depth: usize,
    ) -> Result<FileList, EngineError> {
        let manager = self.session_manager()?;
        let row = manager.row(caller, session_id)?;
        let work = manager.paths(&row)?.work;
        let rel = path.to_owned();
        let depth = depth.clamp(1, 10);
        let (entries, truncated) = self
            .calls
            .on_host(caller, "list the directory", move || {
                files::list(&work, &rel, depth, MAX_LIST_ENTRIES)
            })
            .await?
            .map_err(file_error)?;
        Ok(FileList {
            session_id: row.id,
            path: path.to_owned(),
            entries,
            truncated,
        })
    }
}

/// The reply to a failed file operation: the message and a hint for the agent.
pub(super) fn file_error(err: FsError) -> EngineError {
    let kind = crate::Hint::kind(&err);
    let hint = match &err {
        FsError::Path(_) => {
            "paths are relative to the session's workspace (its working directory), e.g. \"data/input.csv\""
        }
        FsError::Symlink { .. } => "read the link's target by its own path inside the workspace",
        FsError::TooLarge { .. } => "read large files in pieces from the session's code",
        _ => "list_files shows what is there",
    };
    let message = match &err {
        FsError::Path(_) => format!("The path is not allowed in the session's workspace: {err}"),
        _ => err.with_cause(),
    };
    EngineError {
        kind,
        message,
        hint: Some(hint.into()),
    }
}
