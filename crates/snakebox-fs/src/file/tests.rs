use std::os::unix::fs::{MetadataExt, symlink};

use super::*;

fn rel(path: &str) -> RelativePath {
    RelativePath::parse(path).unwrap()
}

/// A root with `a/b/c/file` inside and a canary outside, both under one temporary directory.
struct Fixture {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        fs_err::create_dir_all(root.join("a/b/c")).unwrap();
        fs_err::write(root.join("a/b/c/file"), "inside").unwrap();
        fs_err::create_dir_all(outside.join("a/b/c")).unwrap();
        fs_err::write(outside.join("a/b/c/file"), "canary").unwrap();
        fs_err::write(outside.join("file"), "canary").unwrap();
        Self {
            _tmp: tmp,
            root,
            outside,
        }
    }

    fn canaries_untouched(&self) {
        for path in ["a/b/c/file", "file"] {
            assert_eq!(
                fs_err::read_to_string(self.outside.join(path)).unwrap(),
                "canary"
            );
        }
        assert_eq!(
            fs_err::read_dir(self.outside.join("a/b/c"))
                .unwrap()
                .count(),
            1
        );
    }
}

#[test]
fn write_then_read_round_trips_and_replaces() {
    let fx = Fixture::new();
    assert_eq!(
        write(&fx.root, &rel("new/dir/f.txt"), b"hello", None).unwrap(),
        5
    );
    assert_eq!(
        read(&fx.root, &rel("new/dir/f.txt"), 100).unwrap(),
        b"hello"
    );
    write(&fx.root, &rel("new/dir/f.txt"), b"x", None).unwrap();
    assert_eq!(read(&fx.root, &rel("./new//dir/f.txt"), 100).unwrap(), b"x");
    let meta = fs_err::metadata(fx.root.join("new/dir/f.txt")).unwrap();
    assert_eq!(meta.mode() & 0o7777, FILE_MODE);
    let meta = fs_err::metadata(fx.root.join("new/dir")).unwrap();
    assert_eq!(meta.mode() & 0o7777, DIR_MODE);
    // No temporary name is left behind.
    let names: Vec<_> = fs_err::read_dir(fx.root.join("new/dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f.txt"]);
}

#[test]
fn read_refuses_what_is_not_a_small_regular_file() {
    let fx = Fixture::new();
    nix::unistd::mkfifo(&fx.root.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
    for (path, limit, expected) in [
        ("a/b/c/file", 5, "too large"),
        ("a/b", 100, "not a file"),
        ("", 100, "not a file"),
        ("fifo", 100, "not a file"),
        ("missing", 100, "not found"),
        ("a/b/c/file/x", 100, "not a directory"),
    ] {
        let err = read(&fx.root, &rel(path), limit).unwrap_err();
        let kind = match err {
            FsError::TooLarge {
                size: 6, limit: 5, ..
            } => "too large",
            FsError::NotAFile { .. } => "not a file",
            FsError::NotFound { .. } => "not found",
            FsError::NotADirectory { .. } => "not a directory",
            _ => "other",
        };
        assert_eq!(kind, expected, "{path}: {err:?}");
    }
}

#[test]
fn the_writer_never_replaces_a_directory_nor_writes_the_root() {
    let fx = Fixture::new();
    assert!(matches!(
        write(&fx.root, &rel("a/b"), b"x", None),
        Err(FsError::NotAFile { .. })
    ));
    assert!(matches!(
        write(&fx.root, &rel(""), b"x", None),
        Err(FsError::Path(PathError::Empty))
    ));
    assert!(matches!(
        write(&fx.root, &rel("a/b/c/file/x"), b"x", None),
        Err(FsError::NotADirectory { .. })
    ));
    assert_eq!(read(&fx.root, &rel("a/b/c/file"), 100).unwrap(), b"inside");
}

/// A link planted in place of each component of `a/b/c/file`, pointing at the same place
/// outside: reading, listing and writing through it must fail (or, for the last name of a
/// write, replace the link itself), with either way of resolving.
#[test]
fn links_at_every_component_are_never_followed() {
    let names = ["a", "a/b", "a/b/c", "a/b/c/file"];
    for (i, planted) in names.iter().enumerate() {
        for try_openat2 in [true, false] {
            let fx = Fixture::new();
            let real = fx.root.join(planted);
            crate::tree::remove(&real).unwrap();
            symlink(fx.outside.join(planted), &real).unwrap();
            let root_fd = open_root(&fx.root, "").unwrap();
            let is_last = i == names.len() - 1;

            // The directories above the file.
            let dirs: Vec<String> = "a/b/c".split('/').map(String::from).collect();
            let opened = beneath_with(root_fd.as_fd(), &dirs, None, try_openat2);
            assert_eq!(
                opened.err(),
                (!is_last).then_some(Errno::ELOOP),
                "{planted} openat2={try_openat2}"
            );
            let created = beneath_with(root_fd.as_fd(), &dirs, Some(None), try_openat2);
            assert_eq!(created.is_err(), !is_last, "{planted}");

            assert!(
                read(&fx.root, &rel("a/b/c/file"), 100).is_err(),
                "{planted}"
            );
            let written = write(&fx.root, &rel("a/b/c/file"), b"pwned", None);
            if is_last {
                // The link itself is replaced by a file.
                written.unwrap();
                let meta = fs_err::symlink_metadata(&real).unwrap();
                assert!(meta.is_file());
                assert_eq!(read(&fx.root, &rel(planted), 100).unwrap(), b"pwned");
            } else {
                assert!(
                    matches!(written, Err(FsError::Symlink { .. })),
                    "{written:?}"
                );
                let opened = open_dir(root_fd.as_fd(), &rel(planted));
                assert!(matches!(opened, Err(FsError::Symlink { .. })), "{opened:?}");
            }
            // A new file beside, under the planted link.
            let beside = format!("{planted}/new");
            assert!(write(&fx.root, &rel(&beside), b"pwned", None).is_err());
            fx.canaries_untouched();
        }
    }
}

#[test]
fn a_hard_link_is_replaced_not_written_through() {
    let fx = Fixture::new();
    fs_err::hard_link(fx.outside.join("file"), fx.root.join("hard")).unwrap();
    write(&fx.root, &rel("hard"), b"new", None).unwrap();
    assert_eq!(read(&fx.root, &rel("hard"), 100).unwrap(), b"new");
    fx.canaries_untouched();
}

#[test]
fn the_root_itself_may_not_be_a_link() {
    let fx = Fixture::new();
    let link = fx.root.join("link-root");
    symlink(&fx.outside, &link).unwrap();
    let read = read(&link, &rel("file"), 100);
    assert!(matches!(read, Err(FsError::Symlink { .. })), "{read:?}");
    assert!(write(&link, &rel("new"), b"x", None).is_err());
    fx.canaries_untouched();
}

#[test]
fn deep_paths_are_written_and_read() {
    let fx = Fixture::new();
    let deep = vec!["d"; 1000].join("/") + "/f";
    write(&fx.root, &rel(&deep), b"deep", None).unwrap();
    assert_eq!(read(&fx.root, &rel(&deep), 10).unwrap(), b"deep");
    for try_openat2 in [true, false] {
        let root_fd = open_root(&fx.root, "").unwrap();
        let names = vec!["d".to_string(); 1000];
        assert!(beneath_with(root_fd.as_fd(), &names, None, try_openat2).is_ok());
    }
}

#[test]
fn files_are_given_to_the_owner() {
    let fx = Fixture::new();
    // Our own ids: the ownership calls are exercised without needing privileges.
    let owner = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    write(&fx.root, &rel("o/f"), b"x", Some(owner)).unwrap();
    for path in ["o", "o/f"] {
        let meta = fs_err::metadata(fx.root.join(path)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), owner, "{path}");
    }
}

/// Another thread swaps a directory of the path for a link to the outside as fast as it can:
/// whatever the interleaving, nothing outside is read or written.
#[test]
fn a_directory_swapped_for_a_link_meanwhile_is_never_followed() {
    let fx = Fixture::new();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let swapper = {
        let (root, outside, stop) = (fx.root.clone(), fx.outside.clone(), stop.clone());
        std::thread::spawn(move || {
            let (real, link) = (root.join("a"), root.join("a-link"));
            symlink(outside.join("a"), &link).unwrap();
            // `a` is always there: the directory or the link, exchanged atomically.
            while !stop.load(Ordering::Relaxed) {
                nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &real,
                    nix::fcntl::AT_FDCWD,
                    &link,
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                )
                .unwrap();
            }
        })
    };
    for _ in 0..2000 {
        if let Ok(data) = read(&fx.root, &rel("a/b/c/file"), 100) {
            assert_eq!(data, b"inside");
        }
        let _ = write(&fx.root, &rel("a/b/c/new"), b"pwned", None);
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    fx.canaries_untouched();
}
