//! The file tools: `write_file`, `read_file` and `list_files` in a session's workspace.
//!
//! The confinement itself (plain relative names walked with `O_NOFOLLOW`, never a symlink
//! followed) is in [`super::files`]; this module adds the sessions' checks (size, encoding,
//! the disk cap, the session's lock while writing) and the tools' errors and hints.

use crate::Caller;
use snakebox_sandbox::Identity;

use super::{
    FileContent, FileList, FileWritten, MAX_FILE_BYTES, MAX_LIST_ENTRIES, files, io_error,
    no_session, now_secs,
};
use crate::Engine;
use crate::result::ErrorInfo;

impl Engine {
    /// Write a file into a session's workspace (parents created).
    ///
    /// # Errors
    /// No such session, a path outside the workspace, too large, disk full.
    pub async fn write_file(
        &self,
        caller: &Caller,
        session_id: &str,
        path: &str,
        content: &str,
        encoding: Option<&str>,
    ) -> Result<FileWritten, ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(caller, session_id)?;
        let content = match encoding.map(str::to_ascii_lowercase).as_deref() {
            None | Some("utf-8" | "utf8" | "text") => content.as_bytes().to_vec(),
            Some("base64") => decode_base64(content).ok_or_else(|| ErrorInfo {
                message: "The content is not valid base64".into(),
                hint: Some("encode binary content with standard base64 (RFC 4648)".into()),
            })?,
            Some(other) => {
                return Err(ErrorInfo {
                    message: format!("Unknown encoding `{other}`"),
                    hint: Some("use \"utf-8\" (default) or \"base64\"".into()),
                });
            }
        };
        if content.len() as u64 > MAX_FILE_BYTES {
            return Err(ErrorInfo {
                message: format!(
                    "The content is {} bytes, more than the limit of {MAX_FILE_BYTES} bytes",
                    content.len()
                ),
                hint: Some(
                    "write large data in pieces, or download it from the session's code".into(),
                ),
            });
        }
        manager.check_disk()?;
        let owner = self.session_sandbox()?.host_ids(Identity::Untrusted);
        let work = manager.paths(&row.id).work;
        let slot = manager.slot(&row);
        let state = slot.state.lock().await;
        if state.deleted {
            return Err(no_session(session_id));
        }
        let rel = path.to_owned();
        let size = tokio::task::spawn_blocking(move || files::write(&work, &rel, &content, owner))
            .await
            .map_err(|err| io_error("write the file", &std::io::Error::other(err)))?
            .map_err(file_error)?;
        drop(state);
        let _ = manager.store.touch(&row.id, now_secs(), false);
        manager.remeasure(&row.id).await;
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
    pub async fn read_file(
        &self,
        caller: &Caller,
        session_id: &str,
        path: &str,
    ) -> Result<FileContent, ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(caller, session_id)?;
        let work = manager.paths(&row.id).work;
        let rel = path.to_owned();
        let data = tokio::task::spawn_blocking(move || files::read(&work, &rel, MAX_FILE_BYTES))
            .await
            .map_err(|err| io_error("read the file", &std::io::Error::other(err)))?
            .map_err(file_error)?;
        let size = data.len() as u64;
        let (encoding, content) = match String::from_utf8(data) {
            Ok(text) => ("utf-8", text),
            Err(err) => ("base64", base64(err.as_bytes())),
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
    pub async fn list_files(
        &self,
        caller: &Caller,
        session_id: &str,
        path: &str,
        depth: usize,
    ) -> Result<FileList, ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(caller, session_id)?;
        let work = manager.paths(&row.id).work;
        let rel = path.to_owned();
        let depth = depth.clamp(1, 10);
        let (entries, truncated) =
            tokio::task::spawn_blocking(move || files::list(&work, &rel, depth, MAX_LIST_ENTRIES))
                .await
                .map_err(|err| io_error("list the directory", &std::io::Error::other(err)))?
                .map_err(file_error)?;
        Ok(FileList {
            session_id: row.id,
            path: path.to_owned(),
            entries,
            truncated,
        })
    }
}

pub(super) fn file_error(err: files::FileError) -> ErrorInfo {
    let hint = match &err {
        files::FileError::BadPath { .. } => {
            "paths are relative to the session's workspace (its working directory), e.g. \"data/input.csv\""
        }
        files::FileError::NotFound { .. } => "list_files shows what is there",
        files::FileError::Symlink { .. } => {
            "read the link's target by its own path inside the workspace"
        }
        files::FileError::TooLarge { .. } => "read large files in pieces from the session's code",
        _ => "list_files shows what is there",
    };
    ErrorInfo {
        message: err.to_string(),
        hint: Some(hint.into()),
    }
}
/// Standard base64 with padding.
pub(super) fn base64(data: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(TABLE[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
/// Decode standard base64 (padding optional, whitespace ignored).
pub(crate) fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut acc: u32 = 0;
    let mut bits = 0;
    let mut padding = false;
    for c in text.bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding = true;
                continue;
            }
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return None,
        };
        if padding {
            return None;
        }
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    (bits < 6).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(&[0xff, 0x00, 0x80, 0x7f]), "/wCAfw==");
        for data in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            &[0xff, 0x00, 0x80, 0x7f],
        ] {
            assert_eq!(decode_base64(&base64(data)).as_deref(), Some(data));
        }
        assert_eq!(decode_base64("Zm9v\nYmFy").as_deref(), Some(&b"foobar"[..]));
        assert_eq!(decode_base64("Zm9v!"), None);
        assert_eq!(decode_base64("Zg==Zg"), None);
    }
}
