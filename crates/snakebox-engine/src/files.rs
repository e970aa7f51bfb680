//! Files in: the `files` argument of an execution, checked, decoded and written into the run's
//! working directory before the script starts.
//!
//! Paths are checked and files written by the confined-fs crate ([`snakebox_fs`]): the same
//! rules as every other caller-given path, and nothing already in the working directory (a
//! session's, say) can redirect a write through a link.

use std::collections::BTreeSet;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_fs::RelativePath;

use crate::EngineError;

/// Most files one call may send.
pub const MAX_INPUT_FILES: usize = 100;
/// Most bytes (decoded) one call may send, all files together.
pub const MAX_INPUT_BYTES: usize = 32 << 20;

/// How the `content` of an input file is encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileEncoding {
    /// Text, written as UTF-8 (the default).
    #[default]
    #[serde(rename = "utf-8", alias = "utf8", alias = "text")]
    Utf8,
    /// Binary content, standard base64 (padding optional).
    Base64,
}

/// One file to place in the working directory before the script runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// Relative path inside the working directory, e.g. `data/in.csv`.
    pub path: String,
    /// The content, as text or base64 according to `encoding`.
    pub content: String,
    /// How `content` is encoded.
    pub encoding: FileEncoding,
}

/// A checked input file: a validated path and decoded bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodedFile {
    /// Where it goes, relative to the working directory.
    pub(crate) path: RelativePath,
    /// The bytes to write.
    pub(crate) bytes: Vec<u8>,
}

/// Decode standard base64: padding optional, ASCII whitespace (line breaks) ignored. The one
/// decoder of the engine (input files, the session's `write_file`).
///
/// # Errors
/// When the text is not base64.
pub(crate) fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const STANDARD_ANY_PAD: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let compact: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    STANDARD_ANY_PAD.decode(compact)
}

/// Encode standard base64, with padding (the one encoder of the engine).
pub(crate) fn encode_base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Check and decode the `files` of a request.
///
/// # Errors
/// An invalid-request [`EngineError`] with a hint naming the offending file: too many files, too many bytes,
/// a bad path, invalid base64, or the same path twice (or a file used as a directory).
pub(crate) fn decode(files: &[InputFile]) -> Result<Vec<DecodedFile>, EngineError> {
    if files.len() > MAX_INPUT_FILES {
        return Err(EngineError::invalid(
            format!(
                "{} input files were sent; at most {MAX_INPUT_FILES} are accepted",
                files.len()
            ),
            "send fewer files, e.g. one archive (base64) that the script unpacks",
        ));
    }
    let mut decoded = Vec::with_capacity(files.len());
    let mut total = 0usize;
    let mut seen_files = BTreeSet::new();
    let mut seen_dirs = BTreeSet::new();
    for file in files {
        let path = RelativePath::parse_entry(&file.path).map_err(|err| {
            EngineError::invalid(format!("Invalid input file path: {err}"), err.hint())
        })?;
        let bytes = match file.encoding {
            FileEncoding::Utf8 => file.content.as_bytes().to_vec(),
            FileEncoding::Base64 => {
                decode_base64(&file.content).map_err(|err| {
                        EngineError::invalid(
                            format!("The content of input file `{}` is not valid base64: {err}", file.path),
                            "encode binary content with standard base64 (A-Z, a-z, 0-9, +, /), or send text with \"encoding\": \"utf-8\"",
                        )
                    })?
            }
        };
        total = total.saturating_add(bytes.len());
        if total > MAX_INPUT_BYTES {
            return Err(EngineError::invalid(
                format!(
                    "The input files add up to more than {} MiB (at `{}`)",
                    MAX_INPUT_BYTES >> 20,
                    file.path
                ),
                "send less data, or let the script download it (when the server allows network access)",
            ));
        }
        let joined = path.to_string();
        for prefix in path.ancestors() {
            if seen_files.contains(&prefix) {
                return Err(EngineError::invalid(
                    format!("Input file `{prefix}` is also used as a directory (by `{joined}`)"),
                    "give every input file a distinct path that is not another file's directory",
                ));
            }
            seen_dirs.insert(prefix);
        }
        if seen_dirs.contains(&joined) || !seen_files.insert(joined.clone()) {
            return Err(EngineError::invalid(
                format!("Input file path `{joined}` is given twice (or is also a directory)"),
                "give every input file a distinct path",
            ));
        }
        decoded.push(DecodedFile { path, bytes });
    }
    Ok(decoded)
}

/// Write checked input files under `root` with the confined writer
/// ([`snakebox_fs::write`]: directories created as needed, never through a link, each file
/// renamed over whatever was at its path). What is created is given to `owner` (the sandbox's
/// host uid/gid) when set.
///
/// # Errors
/// The first file that could not be written.
pub(crate) fn write(
    root: &Path,
    files: &[DecodedFile],
    owner: Option<snakebox_fs::Owner>,
) -> Result<(), snakebox_fs::FsError> {
    files
        .iter()
        .try_for_each(|file| snakebox_fs::write(root, &file.path, &file.bytes, owner).map(drop))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(path: &str, content: &str) -> InputFile {
        InputFile {
            path: path.into(),
            content: content.into(),
            encoding: FileEncoding::Utf8,
        }
    }

    #[test]
    fn decode_checks_count_size_duplicates_and_base64() {
        let ok = decode(&[
            text("a.txt", "hi"),
            InputFile {
                path: "bin/b.dat".into(),
                content: "AAEC/w==".into(),
                encoding: FileEncoding::Base64,
            },
        ])
        .unwrap();
        assert_eq!(ok[0].bytes, b"hi");
        assert_eq!(ok[1].bytes, [0, 1, 2, 255]);
        assert_eq!(ok[1].path.to_string(), "bin/b.dat");

        let many: Vec<_> = (0..=MAX_INPUT_FILES)
            .map(|i| text(&format!("f{i}"), ""))
            .collect();
        assert!(decode(&many).unwrap_err().message.contains("at most"));
        let big = text("big", &"x".repeat(MAX_INPUT_BYTES + 1));
        assert!(decode(&[big]).unwrap_err().message.contains("MiB"));
        let twice = decode(&[text("a", ""), text("a", "")]).unwrap_err();
        assert!(twice.message.contains("twice"), "{}", twice.message);
        let file_and_dir = decode(&[text("a", ""), text("a/b", "")]).unwrap_err();
        assert!(file_and_dir.message.contains("directory"));
        let dir_and_file = decode(&[text("a/b", ""), text("a", "")]).unwrap_err();
        assert!(dir_and_file.message.contains("twice"));
        let bad = decode(&[InputFile {
            path: "x".into(),
            content: "not base64!".into(),
            encoding: FileEncoding::Base64,
        }])
        .unwrap_err();
        assert!(bad.message.contains("base64") && bad.hint.is_some());
        let absolute = decode(&[text("/etc/x", "")]).unwrap_err();
        assert!(absolute.message.contains("absolute") && absolute.hint.is_some());
    }

    #[test]
    fn base64_is_the_standard_with_optional_padding_and_line_breaks() {
        for data in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            &[0xff, 0x00, 0x80, 0x7f],
        ] {
            let text = encode_base64(data);
            assert_eq!(decode_base64(&text).unwrap(), data);
            assert_eq!(decode_base64(text.trim_end_matches('=')).unwrap(), data);
        }
        assert_eq!(encode_base64(b"f"), "Zg==");
        assert_eq!(encode_base64(&[0xff, 0x00, 0x80, 0x7f]), "/wCAfw==");
        assert_eq!(decode_base64(" Zm9v\nYmFy\r\n").unwrap(), b"foobar");
        for bad in ["Zm9v!", "Zg==Zg", "Z", "not base64!"] {
            assert!(decode_base64(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn write_creates_directories_and_never_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs_err::write(outside.path().join("target"), "precious").unwrap();
        // A planted link where a directory and a file are to be written.
        std::os::unix::fs::symlink(outside.path(), dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("target"), dir.path().join("f")).unwrap();

        let files = decode(&[text("data/in.csv", "a,b\n"), text("f", "new")]).unwrap();
        write(dir.path(), &files, None).unwrap();
        assert_eq!(
            fs_err::read_to_string(dir.path().join("data/in.csv")).unwrap(),
            "a,b\n"
        );
        // The link was replaced by a file; its target is untouched.
        assert_eq!(fs_err::read_to_string(dir.path().join("f")).unwrap(), "new");
        assert_eq!(
            fs_err::read_to_string(outside.path().join("target")).unwrap(),
            "precious"
        );
        let through_link = decode(&[text("sub/x", "boom")]).unwrap();
        let err = write(dir.path(), &through_link, None).unwrap_err();
        assert!(err.to_string().contains("sub/x"), "{err}");
        assert!(!outside.path().join("x").exists());
    }
}
