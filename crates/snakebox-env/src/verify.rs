//! Checking that a new environment is complete before it is published.
//!
//! A build can go wrong without any tool saying so: a short write on a full disk leaves a
//! truncated file (uv and `compileall` then still exit 0), and a damaged file in uv's cache
//! is linked or copied into every environment that uses it. A published environment is reused
//! for as long as it exists, so it is checked first, in two places:
//!
//! - **Installed files, on the host** ([`check_records`]): every file a distribution's
//!   `RECORD` lists with a hash, inside `site-packages`, is read and its SHA-256 compared.
//!   This is host code reading files package code may have touched, so it goes through
//!   `snakebox_fs` (beneath the directory, never through a link, never blocking on a FIFO)
//!   and executes nothing.
//! - **Compiled files, in the package-code sandbox** (`COMPILE_AND_CHECK`): the step that
//!   byte-compiles the environment (package code already, see the `install` module) then
//!   loads every `.pyc` of this interpreter with `marshal`, which fails on a truncated one
//!   (`EOFError: marshal data too short`, what imports hit otherwise).
//!
//! This guards against accidents, not against the packages themselves: a package's own code
//! can rewrite its own files and its `RECORD`, and nothing it does reaches another environment
//! or uv's cache (SECURITY.md, "Installs and builds").

use std::io::Read as _;
use std::os::fd::{AsFd as _, BorrowedFd};
use std::path::Path;

use sha2::{Digest as _, Sha256};
use snakebox_fs::RelativePath;

/// The byte-compiling script run as package code: compile `sys.argv[1]`, then load every
/// `.pyc` of this interpreter under it. Damaged files are printed after
/// [`DAMAGED_PYC_MARKER`], one a line, and the exit status is [`DAMAGED_PYC_EXIT`]; files that
/// do not compile (a package's test data in an old syntax) exit 1, as `compileall` does.
pub(crate) const COMPILE_AND_CHECK: &str = r#"
import compileall, marshal, os, sys
from importlib.util import MAGIC_NUMBER
site = sys.argv[1]
compiled = compileall.compile_dir(site, quiet=1)
tag = "." + sys.implementation.cache_tag + "."
damaged = []
for root, dirs, files in os.walk(site):
    if os.path.basename(root) != "__pycache__":
        continue
    for name in files:
        if tag not in name or not name.endswith(".pyc"):
            continue
        path = os.path.join(root, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
            if len(data) < 16 or data[:4] != MAGIC_NUMBER:
                raise ValueError("bad header")
            marshal.loads(memoryview(data)[16:])
        except Exception as e:
            damaged.append("%s: %s" % (os.path.relpath(path, site), e))
if damaged:
    sys.stderr.write("snakebox-damaged-pyc:\n" + "\n".join(damaged[:50]) + "\n")
    sys.exit(3)
sys.exit(0 if compiled else 1)
"#;

/// The line before the damaged `.pyc` files in `COMPILE_AND_CHECK`'s error output.
pub(crate) const DAMAGED_PYC_MARKER: &str = "snakebox-damaged-pyc:";
/// `COMPILE_AND_CHECK`'s exit status when a `.pyc` does not load.
pub(crate) const DAMAGED_PYC_EXIT: i32 = 3;

/// Whether the compile step ([`crate::InstallPipeline::compile_invocation`]) exited saying
/// that compiled files are damaged (truncated, unloadable).
pub fn is_damaged_compile(exit_code: Option<i32>) -> bool {
    exit_code == Some(DAMAGED_PYC_EXIT)
}

/// The damaged `.pyc` files `COMPILE_AND_CHECK` reported in `stderr`.
pub(crate) fn damaged_pycs(stderr: &str) -> Vec<String> {
    stderr
        .split_once(DAMAGED_PYC_MARKER)
        .map(|(_, rest)| {
            rest.lines()
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Remove the damaged `.pyc` files `COMPILE_AND_CHECK` reported (`damaged`, as
/// `<path under site-packages>: <reason>`) from `site_packages`, so that imports compile the
/// modules in memory instead of failing on them. Only `__pycache__/*.pyc` entries are
/// touched, resolved beneath `site_packages` without following links (package code may have
/// planted any tree there). Returns how many were removed.
pub fn remove_damaged_pycs(site_packages: &Path, damaged: &[String]) -> usize {
    let Ok(root) = snakebox_fs::open_root(site_packages, "site-packages") else {
        return 0;
    };
    let mut removed = 0;
    for line in damaged {
        let path = line
            .split_once(": ")
            .map_or(line.as_str(), |(path, _)| path);
        let Ok(relative) = RelativePath::parse(path) else {
            continue;
        };
        let Some((name, parents)) = relative.split_last() else {
            continue;
        };
        if !name.ends_with(".pyc") || parents.last().map(String::as_str) != Some("__pycache__") {
            continue;
        }
        let Ok(parent) = RelativePath::parse(&parents.join("/")) else {
            continue;
        };
        let Ok(dir) = snakebox_fs::open_dir(root.as_fd(), &parent) else {
            continue;
        };
        if nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether the compile step ([`crate::InstallPipeline::compile_invocation`]) said its
/// compiled files are damaged; the files it named (for [`remove_damaged_pycs`]).
pub fn damaged_compile(exit_code: Option<i32>, stderr: &str) -> Option<Vec<String>> {
    is_damaged_compile(exit_code).then(|| damaged_pycs(stderr))
}

/// One installed file that does not match its distribution's `RECORD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The distribution (`name-version`, from its `.dist-info` directory's name).
    pub distribution: String,
    /// The file, relative to `site-packages`.
    pub path: String,
    /// What is wrong: missing, a different size or hash, not a regular file.
    pub problem: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.path, self.distribution, self.problem)
    }
}

/// Check every file listed with a `sha256` hash in the `RECORD` of each `.dist-info` directory
/// of `site_packages` (entries outside it, such as `../../../bin` scripts that the installer
/// rewrites, are skipped). Returns the mismatches, empty when all is well.
///
/// # Errors
/// When `site_packages` or a `.dist-info` directory cannot be listed.
pub fn check_records(site_packages: &Path) -> std::io::Result<Vec<Mismatch>> {
    let root = snakebox_fs::open_root(site_packages, "site-packages")
        .map_err(|err| std::io::Error::other(err.with_cause()))?;
    let mut mismatches = Vec::new();
    let mut files = Vec::new();
    for entry in fs_err::read_dir(site_packages)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(distribution) = name.strip_suffix(".dist-info") else {
            continue;
        };
        let record_path = match RelativePath::parse(&format!("{name}/RECORD")) {
            Ok(path) => path,
            Err(_) => continue,
        };
        let record = match snakebox_fs::read(site_packages, &record_path, 64 * 1024 * 1024) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(err) => {
                mismatches.push(Mismatch {
                    distribution: distribution.to_owned(),
                    path: format!("{name}/RECORD"),
                    problem: format!("unreadable: {}", err.with_cause()),
                });
                continue;
            }
        };
        for line in record.lines() {
            let Some((path, hash, size)) = parse_record_line(line) else {
                continue;
            };
            let Some(expected) = hash.strip_prefix("sha256=") else {
                continue;
            };
            let Ok(relative) = RelativePath::parse(&path) else {
                continue;
            };
            files.push(RecordedFile {
                distribution: distribution.to_owned(),
                expected: expected.trim_end_matches('=').to_owned(),
                path,
                relative,
                size,
            });
        }
    }
    // Hashing is most of the check (a large set holds hundreds of megabytes): the files are
    // shared out between this thread and, for a set large enough to be worth it, one more
    // per core.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let check_some = || {
        // One buffer per thread for every file (a large set has thousands: a fresh one each
        // was most of the check's own time).
        let mut buffer = vec![0_u8; 256 * 1024];
        let mut found = Vec::new();
        while let Some(file) = files.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
            if let Some(problem) = check_file(root.as_fd(), file, &mut buffer) {
                found.push(Mismatch {
                    distribution: file.distribution.clone(),
                    path: file.path.clone(),
                    problem,
                });
            }
        }
        found
    };
    let helpers = if files.len() >= PARALLEL_FROM_FILES {
        std::thread::available_parallelism().map_or(1, usize::from) - 1
    } else {
        0
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..helpers).map(|_| scope.spawn(check_some)).collect();
        mismatches.extend(check_some());
        for handle in handles {
            match handle.join() {
                Ok(found) => mismatches.extend(found),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    mismatches.sort_by(|a, b| (&a.distribution, &a.path).cmp(&(&b.distribution, &b.path)));
    Ok(mismatches)
}

/// How many files a check needs before it takes more than its own thread.
const PARALLEL_FROM_FILES: usize = 200;

/// A file a `RECORD` lists with its SHA-256.
struct RecordedFile {
    distribution: String,
    /// As the `RECORD` spells it.
    path: String,
    relative: RelativePath,
    /// The hash, URL-safe base64 without padding.
    expected: String,
    size: Option<u64>,
}

/// What is wrong with `file` below `root`, if anything.
fn check_file(root: BorrowedFd<'_>, file: &RecordedFile, buffer: &mut [u8]) -> Option<String> {
    let (mut opened, stat) = match snakebox_fs::open_file(root, &file.relative) {
        Ok(opened) => opened,
        Err(err) => return Some(err.with_cause()),
    };
    let actual_size = u64::try_from(stat.st_size).unwrap_or(0);
    if let Some(size) = file.size.filter(|size| *size != actual_size) {
        return Some(format!("{actual_size} bytes, the RECORD says {size}"));
    }
    let mut hasher = Sha256::new();
    loop {
        match opened.read(buffer) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buffer[..n]),
            Err(err) => return Some(format!("unreadable: {err}")),
        }
    }
    (urlsafe_nopad(&hasher.finalize()) != file.expected)
        .then(|| "its SHA-256 differs from the RECORD's".to_owned())
}

/// One `RECORD` line (CSV: `path,hash,size`, the path quoted when it holds a comma or a
/// quote): the path, the hash (may be empty) and the size when given.
fn parse_record_line(line: &str) -> Option<(String, String, Option<u64>)> {
    let mut fields: Vec<String> = Vec::with_capacity(3);
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.trim_end_matches('\r').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    fields.push(field);
    let mut fields = fields.into_iter();
    let path = fields.next().filter(|path| !path.is_empty())?;
    let hash = fields.next().unwrap_or_default();
    let size = fields.next().and_then(|size| size.trim().parse().ok());
    Some((path, hash, size))
}

/// Base64, URL-safe alphabet, no padding (the `RECORD` hash encoding, PEP 376/427).
fn urlsafe_nopad(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn hash(data: &[u8]) -> String {
        format!("sha256={}", urlsafe_nopad(&Sha256::digest(data)))
    }

    /// A `site-packages` with one distribution `demo-1.0` holding `files`, recorded as given.
    fn site(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let dist = dir.path().join("demo-1.0.dist-info");
        fs_err::create_dir_all(&dist).unwrap();
        let mut record = String::new();
        for (path, data) in files {
            let full = dir.path().join(path);
            fs_err::create_dir_all(full.parent().unwrap()).unwrap();
            fs_err::write(&full, data).unwrap();
            record.push_str(&format!("{path},{},{}\n", hash(data), data.len()));
        }
        record.push_str("demo-1.0.dist-info/RECORD,,\n");
        record.push_str("../../../bin/demo,sha256=rewritten-by-the-installer,10\n");
        fs_err::write(dist.join("RECORD"), record).unwrap();
        dir
    }

    #[test]
    fn a_complete_installation_passes() {
        let dir = site(&[("demo/__init__.py", b"X = 1\n"), ("demo/a,b.py", b"")]);
        // A path with a comma is quoted.
        let record = dir.path().join("demo-1.0.dist-info/RECORD");
        let text = fs_err::read_to_string(&record).unwrap();
        fs_err::write(&record, text.replace("demo/a,b.py", "\"demo/a,b.py\"")).unwrap();
        assert_eq!(check_records(dir.path()).unwrap(), []);
    }

    #[test]
    fn truncated_changed_missing_and_unsafe_files_are_found() {
        let dir = site(&[
            ("demo/__init__.py", b"X = 1\n"),
            ("demo/big.py", b"Y = 2\n"),
            ("demo/gone.py", b"Z = 3\n"),
            ("demo/linked.py", b"W = 4\n"),
        ]);
        let p = dir.path();
        fs_err::write(p.join("demo/__init__.py"), b"X = ").unwrap();
        fs_err::write(p.join("demo/big.py"), b"Y = 9\n").unwrap();
        fs_err::remove_file(p.join("demo/gone.py")).unwrap();
        fs_err::remove_file(p.join("demo/linked.py")).unwrap();
        std::os::unix::fs::symlink(p.join("demo/big.py"), p.join("demo/linked.py")).unwrap();
        let found = check_records(p).unwrap();
        let paths: Vec<&str> = found.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "demo/__init__.py",
                "demo/big.py",
                "demo/gone.py",
                "demo/linked.py"
            ]
        );
        assert!(found[0].problem.contains("the RECORD says 6"), "{found:?}");
        assert!(found[1].problem.contains("SHA-256"), "{found:?}");
        assert_eq!(found[0].distribution, "demo-1.0");
    }

    #[test]
    fn an_unreadable_record_is_a_mismatch() {
        let dir = site(&[("demo/__init__.py", b"")]);
        let record = dir.path().join("demo-1.0.dist-info/RECORD");
        fs_err::remove_file(&record).unwrap();
        fs_err::create_dir(&record).unwrap();
        fs_err::set_permissions(&record, std::fs::Permissions::from_mode(0o755)).unwrap();
        let found = check_records(dir.path()).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].problem.starts_with("unreadable"));
    }

    #[test]
    fn record_lines_are_parsed_as_csv() {
        assert_eq!(
            parse_record_line("a/b.py,sha256=x,12"),
            Some(("a/b.py".into(), "sha256=x".into(), Some(12)))
        );
        assert_eq!(
            parse_record_line("\"a,\"\"q\"\".py\",sha256=y,"),
            Some(("a,\"q\".py".into(), "sha256=y".into(), None))
        );
        assert_eq!(
            parse_record_line("x/RECORD,,"),
            Some(("x/RECORD".into(), String::new(), None))
        );
        assert_eq!(parse_record_line(""), None);
    }

    /// The compile step's script with a real interpreter: a `.pyc` cut short after its header
    /// (what a short write on a full disk leaves; `compileall` takes it as up to date) is
    /// reported, with the exit status the build reads.
    #[test]
    fn the_compile_step_reports_a_truncated_pyc() {
        let python = Path::new("/usr/bin/python3");
        if !python.exists() {
            // No interpreter on this machine: nothing to run the script with.
            return;
        }
        let site = tempfile::tempdir().unwrap();
        let package = site.path().join("demo");
        fs_err::create_dir_all(&package).unwrap();
        fs_err::write(
            package.join("__init__.py"),
            "X = list(range(500))\n".repeat(50),
        )
        .unwrap();
        let run = || {
            std::process::Command::new(python)
                .args(["-I", "-c", COMPILE_AND_CHECK])
                .arg(site.path())
                .output()
                .unwrap()
        };
        let first = run();
        assert_eq!(first.status.code(), Some(0), "{first:?}");
        let pyc = fs_err::read_dir(package.join("__pycache__"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let file = fs_err::OpenOptions::new().write(true).open(&pyc).unwrap();
        file.set_len(40).unwrap();
        let second = run();
        assert!(is_damaged_compile(second.status.code()), "{second:?}");
        let damaged = damaged_pycs(&String::from_utf8_lossy(&second.stderr));
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert!(
            damaged[0].starts_with("demo/__pycache__/__init__."),
            "{damaged:?}"
        );
        assert!(damaged[0].contains("marshal data too short"), "{damaged:?}");
        // Removed (and nothing outside `__pycache__`), so that imports compile it in memory.
        let outside = format!("{}: planted", "demo/__init__.py");
        assert_eq!(
            remove_damaged_pycs(site.path(), &[damaged[0].clone(), outside]),
            1
        );
        assert!(!pyc.exists() && package.join("__init__.py").exists());
    }

    #[test]
    fn damaged_pycs_are_read_from_the_scripts_output() {
        let stderr = "Listing...\nsnakebox-damaged-pyc:\na/__pycache__/x.cpython-312.pyc: marshal data too short\n";
        assert_eq!(
            damaged_pycs(stderr),
            ["a/__pycache__/x.cpython-312.pyc: marshal data too short"]
        );
        assert!(damaged_pycs("nothing").is_empty());
    }
}
