//! The in-sandbox runner (`runner.py`, embedded) and the record it sends back.
//!
//! The runner executes the user's script as `__main__` and, at the end, writes one JSON
//! record to a private pipe (the sandbox's control channel): the last expression's value, the
//! names defined, the uncaught exception with the script's own traceback, and the images it
//! captured (matplotlib figures, a PIL image as the last expression).
//!
//! Trust: the record is only as trustworthy as the user's code, which runs in the same
//! process and can write to the pipe too. So it is parsed defensively (the last line only,
//! every field optional, every size capped, images checked by their magic bytes and renamed
//! by us), and it never decides anything that matters: the status and exit code come from the
//! supervisor, stdout and stderr from their own pipes, which the record cannot forge.

use std::path::Path;

use base64::Engine as _;
use serde::Deserialize;

use crate::artifacts::{Baseline, Collection, GeneratedImage, image_mime};
use crate::result::{ArtifactOrigin, ExceptionInfo, ExecutionResult, ValueRepr};

/// The runner's source, written next to the script in the run's input directory.
pub(crate) const SOURCE: &str = include_str!("runner.py");
/// Its file name in the input directory.
pub(crate) const FILE_NAME: &str = "runner.py";
/// The run's import policy, beside the script (see `runner.py`, `_install_import_policy`).
pub(crate) const IMPORT_POLICY_FILE: &str = "imports.json";
/// The descriptor the sandbox gives the control channel.
pub(crate) const CONTROL_FD: &str = "3";

const REPR_MAX_BYTES: usize = 10_000;
const JSON_MAX_BYTES: usize = 64 << 10;
const MESSAGE_MAX_BYTES: usize = 10_000;
const TRACEBACK_MAX_BYTES: usize = 50_000;
const MAX_NAMES: usize = 500;
const NAME_MAX_BYTES: usize = 200;
const MAX_IMAGES: usize = 16;
const IMAGE_MAX_BYTES: usize = 4 << 20;
const IMAGES_TOTAL_BYTES: usize = 10 << 20;
const MAX_NOTES: usize = 20;
const NOTE_MAX_BYTES: usize = 500;
/// Modules of a run's `imported`, at most (the runner's `MAX_IMPORTED`).
const MAX_IMPORTED: usize = 256;

/// The record as sent: every field optional, unknown fields ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawRecord {
    value: Option<RawValue>,
    names: Vec<String>,
    exception: Option<RawException>,
    images: Vec<RawImage>,
    notes: Vec<String>,
    blocked_imports: Vec<RawBlocked>,
    blocked_exec: Vec<String>,
    result_variable: Option<RawValue>,
    imported: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawBlocked {
    module: String,
    line: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawValue {
    repr: String,
    json: Option<serde_json::Value>,
    type_name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawException {
    type_name: String,
    message: String,
    traceback: String,
    line: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawImage {
    source: String,
    data: String,
}

/// What the engine takes from the record, checked and capped.
#[derive(Debug, Default)]
pub(crate) struct Record {
    pub(crate) value: Option<ValueRepr>,
    pub(crate) names: Vec<String>,
    pub(crate) exception: Option<ExceptionInfo>,
    pub(crate) images: Vec<GeneratedImage>,
    pub(crate) notes: Vec<String>,
    /// Imports of the script's own code that its import policy refused.
    pub(crate) blocked_imports: Vec<(String, Option<u32>)>,
    /// Programs the script tried to start under a profile that denies subprocesses.
    pub(crate) blocked_exec: Vec<String>,
    /// The value of the script's top-level `result` variable.
    pub(crate) result_variable: Option<ValueRepr>,
    /// The modules the run imported (`--report-imports`): dotted names of identifiers only,
    /// at most [`MAX_IMPORTED`]. The script can write anything here; the pool only counts
    /// these names (see `WarmPool::learn`).
    pub(crate) imported: Vec<String>,
}

/// A value from the record, capped.
fn value_of(value: RawValue) -> ValueRepr {
    ValueRepr {
        repr: cap(value.repr, REPR_MAX_BYTES),
        json: value.json.filter(|json| {
            serde_json::to_vec(json).is_ok_and(|bytes| bytes.len() <= JSON_MAX_BYTES)
        }),
        type_name: cap(value.type_name, NAME_MAX_BYTES),
    }
}

impl Record {
    /// Parse the control channel's bytes. `None` when there is no record (the script ended
    /// the interpreter abruptly, or was killed); a note when there is one but it is malformed.
    pub(crate) fn parse(control: &[u8]) -> Result<Option<Record>, String> {
        // The runner writes "\n<json>\n" last: take the last non-empty line, so bytes the
        // script wrote earlier do not matter.
        let Some(line) = control
            .split(|&b| b == b'\n')
            .rev()
            .find(|line| !line.iter().all(u8::is_ascii_whitespace))
        else {
            return Ok(None);
        };
        let raw: RawRecord = serde_json::from_slice(line).map_err(|err| {
            format!(
                "the runner's result record was unreadable ({err}); the value, names and exception are not reported"
            )
        })?;
        Ok(Some(Record::check(raw)))
    }

    fn check(raw: RawRecord) -> Record {
        let value = raw.value.map(value_of);
        let exception = raw.exception.map(|exception| ExceptionInfo {
            type_name: cap(exception.type_name, NAME_MAX_BYTES),
            message: cap(exception.message, MESSAGE_MAX_BYTES),
            traceback: cap_tail(exception.traceback, TRACEBACK_MAX_BYTES),
            line: exception.line,
        });
        let names = raw
            .names
            .into_iter()
            .take(MAX_NAMES)
            .map(|name| cap(name, NAME_MAX_BYTES))
            .collect();
        let mut notes: Vec<String> = raw
            .notes
            .into_iter()
            .take(MAX_NOTES)
            .map(|note| cap(note, NOTE_MAX_BYTES))
            .collect();
        let mut images = Vec::new();
        let mut total = 0usize;
        let mut figures = 0usize;
        for image in raw.images.into_iter().take(MAX_IMAGES) {
            let Ok(data) = base64::engine::general_purpose::STANDARD.decode(image.data.as_bytes())
            else {
                notes.push("an image from the runner was not valid base64 and was dropped".into());
                continue;
            };
            if data.len() > IMAGE_MAX_BYTES || total + data.len() > IMAGES_TOTAL_BYTES {
                notes.push("an image from the runner was too large and was dropped".into());
                continue;
            }
            // Raster formats only: a generated image is never taken for SVG text.
            let Some(mime_type) = image_mime(&data, "").filter(|m| *m != "image/svg+xml") else {
                notes.push(
                    "an image from the runner was not PNG, JPEG, GIF or WebP and was dropped"
                        .into(),
                );
                continue;
            };
            total += data.len();
            let extension = mime_type
                .trim_start_matches("image/")
                .replace("jpeg", "jpg");
            let (origin, name) = if image.source == "value" {
                (ArtifactOrigin::Value, format!("result.{extension}"))
            } else {
                figures += 1;
                (
                    ArtifactOrigin::Figure,
                    format!("figure-{figures}.{extension}"),
                )
            };
            images.push(GeneratedImage {
                name,
                origin,
                mime_type,
                data,
            });
        }
        let blocked_imports = raw
            .blocked_imports
            .into_iter()
            .take(MAX_NOTES)
            .map(|blocked| (cap(blocked.module, NAME_MAX_BYTES), blocked.line))
            .collect();
        let blocked_exec = raw
            .blocked_exec
            .into_iter()
            .take(MAX_NOTES)
            .map(|program| cap(program, NAME_MAX_BYTES))
            .collect();
        let result_variable = raw.result_variable.map(value_of);
        let imported = raw
            .imported
            .into_iter()
            .filter(|name| crate::learn::is_module_name(name))
            .take(MAX_IMPORTED)
            .collect();
        Record {
            value,
            names,
            exception,
            images,
            notes,
            blocked_imports,
            blocked_exec,
            result_variable,
            imported,
        }
    }
}

/// Everything a run produced besides its output: the record's contents and the artifacts.
#[derive(Debug, Default)]
pub(crate) struct Rich {
    record: Option<Record>,
    collection: Collection,
    notes: Vec<String>,
}

impl Rich {
    /// The runner's record from the control channel's bytes (its images apart, for the
    /// artifact store); a note when it cannot be read.
    pub(crate) fn read(control: &[u8]) -> (Rich, Vec<GeneratedImage>) {
        let mut rich = Rich::default();
        let images = match Record::parse(control) {
            Ok(Some(mut record)) => {
                let images = std::mem::take(&mut record.images);
                rich.record = Some(record);
                images
            }
            Ok(None) => Vec::new(),
            Err(note) => {
                rich.notes.push(note);
                Vec::new()
            }
        };
        (rich, images)
    }

    /// The modules the run reported it imported (empty unless it was asked to).
    pub(crate) fn take_imported(&mut self) -> Vec<String> {
        self.record
            .as_mut()
            .map(|record| std::mem::take(&mut record.imported))
            .unwrap_or_default()
    }

    /// What the artifact store kept of the run's files and images.
    pub(crate) fn collected(&mut self, collection: Collection) {
        self.collection = collection;
    }

    /// Something about collecting the run's files that its result must say.
    pub(crate) fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// Fill the result's value, names, exception, artifacts and notes.
    pub(crate) fn apply(self, result: &mut ExecutionResult) {
        if let Some(record) = self.record {
            result.result = record.value;
            result.names = record.names;
            result.exception = record.exception;
            result.notes.extend(record.notes);
            result.events.extend(
                record
                    .blocked_imports
                    .into_iter()
                    .map(|(module, line)| crate::events::import_blocked(&module, line)),
            );
            result.events.extend(record.blocked_exec.into_iter().map(|program| {
                crate::events::event(
                    crate::EventKind::ExecBlocked,
                    format!("starting `{program}` was denied: the profile allows no subprocesses (seccomp refused execve)"),
                )
            }));
            result.result_variable = record.result_variable;
        }
        result.notes.extend(self.notes);
        result.notes.extend(self.collection.notes);
        result.artifacts = self.collection.artifacts;
        result.skipped_files = self.collection.skipped;
        result.inline_images = self.collection.inline;
    }
}

/// After a run: read the runner's record and keep the files the run created or changed
/// in `work` (its working directory; `baseline` is what was there before) and the images
/// it produced in the artifact store `artifacts`. Must be called before `work` is removed.
pub(crate) async fn collect_rich(
    artifacts: &crate::artifacts::ArtifactStore,
    caller: &crate::Caller,
    execution_id: &str,
    work: &Path,
    baseline: Baseline,
    control: &[u8],
) -> Rich {
    let (mut rich, images) = Rich::read(control);
    let store = artifacts.clone();
    let work = work.to_path_buf();
    let id = execution_id.to_string();
    let caller = caller.clone();
    match tokio::task::spawn_blocking(move || store.collect(&caller, &id, &work, &baseline, images))
        .await
    {
        Ok(collection) => rich.collected(collection),
        Err(err) => rich.note(format!("the run's files could not be collected: {err}")),
    }
    rich
}

/// At most `max` bytes of `text`, cut at a character boundary, with a marker when cut.
fn cap(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(" [...]");
    text
}

/// The last `max` bytes of `text` (a traceback's end is what matters).
fn cap_tail(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[...]\n{}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    // See: issue 10 (X-01). The runner's reaper writes the tag the sandbox crate parses.
    #[test]
    fn the_runner_writes_the_sandbox_end_report_tag() {
        assert_eq!(snakebox_sandbox::END_REPORT_TAG, b"\x1esnakebox-end ");
        assert!(SOURCE.contains(r#"END_REPORT_TAG = b"\x1esnakebox-end ""#));
    }

    fn png_b64() -> String {
        base64::engine::general_purpose::STANDARD.encode(b"\x89PNG\r\n\x1a\nxyz")
    }

    #[test]
    fn a_record_is_read_from_the_last_line() {
        let control = format!(
            "garbage the script wrote\n{{\"value\":{{\"repr\":\"{{'a': 1}}\",\"json\":{{\"a\":1}},\"type_name\":\"dict\"}},\"names\":[\"x\"],\"images\":[{{\"name\":\"../../etc/x\",\"source\":\"figure\",\"data\":\"{}\"}}],\"extra\":1}}\n",
            png_b64()
        );
        let record = Record::parse(control.as_bytes()).unwrap().unwrap();
        let value = record.value.unwrap();
        assert_eq!(value.json, Some(serde_json::json!({"a": 1})));
        assert_eq!(value.type_name, "dict");
        assert_eq!(record.names, ["x"]);
        // The name is ours, not the record's.
        assert_eq!(record.images[0].name, "figure-1.png");
        assert_eq!(record.images[0].mime_type, "image/png");
    }

    #[test]
    fn missing_or_malformed_records_are_harmless() {
        assert!(Record::parse(b"").unwrap().is_none());
        assert!(Record::parse(b"\n \n").unwrap().is_none());
        assert!(
            Record::parse(b"{not json")
                .unwrap_err()
                .contains("unreadable")
        );
        assert!(Record::parse(b"{\"names\": 5}").is_err());
        let deep = "[".repeat(10_000);
        assert!(Record::parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn sizes_are_capped_and_fake_images_dropped() {
        let long = "é".repeat(20_000);
        let names: Vec<String> = (0..1000).map(|i| format!("n{i}")).collect();
        let raw = serde_json::json!({
            "value": {"repr": long, "json": {"big": "x".repeat(100_000)}, "type_name": "str"},
            "names": names,
            "exception": {"type_name": "E", "message": "m", "traceback": "t".repeat(100_000), "line": 3},
            "images": [
                {"source": "value", "data": base64::engine::general_purpose::STANDARD.encode(b"<svg></svg>")},
                {"source": "value", "data": "%%%"},
            ],
        });
        let record = Record::parse(raw.to_string().as_bytes()).unwrap().unwrap();
        let value = record.value.unwrap();
        assert!(value.repr.len() <= REPR_MAX_BYTES + 10);
        assert!(value.json.is_none());
        assert_eq!(record.names.len(), MAX_NAMES);
        let exception = record.exception.unwrap();
        assert!(exception.traceback.len() <= TRACEBACK_MAX_BYTES + 10);
        assert_eq!(exception.line, Some(3));
        assert!(record.images.is_empty());
        assert_eq!(record.notes.len(), 2);
    }
}
