//! The docker backend's run image, built locally with no registry.
//!
//! Why this image is almost empty: a run sees the host's interpreter and system libraries
//! exactly as the native backend shows them (the host's `/usr`, its top-level library links
//! and a few `/etc` files, bound read-only at the same paths), so the image only has to give
//! those mounts a root to land on. It holds the top-level links of the host's merged `/usr`
//! (`/bin -> usr/bin`, ...), empty directories, and `/etc/passwd` and `/etc/group` naming the
//! sandbox's uids (65534, the installer's 65533 and every leased uid), so that a lookup of
//! the run's own uid works. Nothing in it is executable. It is a few hundred kilobytes,
//! built in milliseconds as a tar archive written here and imported through the Engine API,
//! and the same Python runs as with the native backend. (The alternative, a debootstrap'ed
//! Debian, takes minutes, needs the network, and gives runs a second Python to keep in step.)
//!
//! The tag is the archive's SHA-256 (`snakebox-run:<first 16 hex digits>`): a host with a
//! different layout, or a new snakebox that changes the image, asks for a new tag, and an
//! existing tag never has other content.

use std::path::PathBuf;

use bollard::Docker;
use futures::StreamExt;
use sha2::{Digest, Sha256};

use crate::error::DockerError;
use crate::native::policy::SystemView;
use crate::{LEASED_UID_BASE, LEASED_UIDS};

/// The repository name of run images.
pub(crate) const IMAGE_REPOSITORY: &str = "snakebox-run";

/// Directories the image has (mount points, and the root of a read-only container).
/// `/sbin` is a real, empty directory even on a merged-/usr host: the engine mounts its init
/// (`docker-init`) at `/sbin/docker-init`, which cannot land inside the read-only host `/usr`.
const DIRS: &[&str] = &[
    "etc", "proc", "dev", "sys", "tmp", "usr", "work", "sbin", "snakebox",
];

/// The run image this host needs: its archive and the tag named by the archive's content.
#[derive(Debug, Clone)]
pub struct RunImage {
    tag: String,
    archive: Vec<u8>,
}

impl RunImage {
    /// The image for this host's layout (its top-level links into `/usr`).
    #[must_use]
    pub fn for_host() -> RunImage {
        RunImage::for_view(&crate::native::policy::probe_system_view())
    }

    pub(crate) fn for_view(view: &SystemView) -> RunImage {
        let archive = archive(view);
        let digest = Sha256::digest(&archive);
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        RunImage {
            tag: format!("{IMAGE_REPOSITORY}:{hex}"),
            archive,
        }
    }

    /// `snakebox-run:<content hash>`.
    #[must_use]
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Size of the archive imported.
    #[must_use]
    pub fn archive_bytes(&self) -> usize {
        self.archive.len()
    }

    /// Whether the engine behind `socket` has this image.
    ///
    /// # Errors
    /// When the engine cannot be reached.
    pub async fn exists(&self, socket: &str) -> Result<bool, DockerError> {
        let docker = super::connect(socket)?;
        exists(&docker, &self.tag).await
    }

    /// Import the image into the engine behind `socket` (nothing happens when it is there).
    /// Returns whether it was built now.
    ///
    /// # Errors
    /// When the engine cannot be reached or refuses the import.
    pub async fn build(&self, socket: &str) -> Result<bool, DockerError> {
        let docker = super::connect(socket)?;
        if exists(&docker, &self.tag).await? {
            return Ok(false);
        }
        let (repo, tag) = self
            .tag
            .split_once(':')
            .unwrap_or((IMAGE_REPOSITORY, "latest"));
        let options = bollard::query_parameters::CreateImageOptionsBuilder::default()
            .from_src("-")
            .repo(repo)
            .tag(tag)
            .build();
        let mut progress = docker.create_image(
            Some(options),
            Some(bollard::body_full(self.archive.clone().into())),
            None,
        );
        while let Some(step) = progress.next().await {
            step.map_err(|source| DockerError::Request {
                what: "import the run image",
                source,
            })?;
        }
        if !exists(&docker, &self.tag).await? {
            return Err(DockerError::ImageMissing {
                tag: self.tag.clone(),
            });
        }
        Ok(true)
    }
}

pub(crate) async fn exists(docker: &Docker, tag: &str) -> Result<bool, DockerError> {
    match docker.inspect_image(tag).await {
        Ok(_) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(false),
        Err(source) => Err(DockerError::Request {
            what: "look up the run image",
            source,
        }),
    }
}

/// `/etc/passwd` of the image: root, the sandbox (65534), the installer (65533), and one
/// line per leased uid (each its own group).
fn passwd() -> String {
    let mut text = String::from(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n\
         sandbox:x:65534:65534:sandbox:/tmp:/usr/sbin/nologin\n\
         installer:x:65533:65533:installer:/tmp:/usr/sbin/nologin\n",
    );
    for uid in LEASED_UID_BASE..LEASED_UID_BASE + LEASED_UIDS {
        text.push_str(&format!(
            "run{uid}:x:{uid}:{uid}:run:/tmp:/usr/sbin/nologin\n"
        ));
    }
    text
}

fn group() -> String {
    let mut text = String::from("root:x:0:\nsandbox:x:65534:\ninstaller:x:65533:\n");
    for gid in LEASED_UID_BASE..LEASED_UID_BASE + LEASED_UIDS {
        text.push_str(&format!("run{gid}:x:{gid}:\n"));
    }
    text
}

/// One entry of the archive.
enum Entry {
    Dir(String),
    File(&'static str, Vec<u8>),
    Link(String, PathBuf),
}

/// The image's root file system as a tar archive, byte for byte the same for the same host
/// layout, so that its hash names its content: every header is written here in full (owner
/// 0:0, no user or group names, modification time 0, a fixed mode per kind), nothing is read
/// from the file system.
fn archive(view: &SystemView) -> Vec<u8> {
    let mut entries: Vec<Entry> = DIRS.iter().map(|d| Entry::Dir((*d).to_owned())).collect();
    for (link, target) in &view.symlinks {
        let name = link
            .strip_prefix("/")
            .unwrap_or(link)
            .to_string_lossy()
            .into_owned();
        if name == "sbin" {
            continue;
        }
        entries.push(Entry::Link(name, target.clone()));
    }
    for dir in &view.dirs {
        let name = dir.strip_prefix("/").unwrap_or(dir).to_string_lossy();
        if !DIRS.contains(&name.as_ref()) {
            entries.push(Entry::Dir(name.into_owned()));
        }
    }
    entries.push(Entry::File("etc/passwd", passwd().into_bytes()));
    entries.push(Entry::File("etc/group", group().into_bytes()));
    // Writing into memory fails only on a path tar cannot encode, and these are short,
    // relative names of our own or of the host's top-level directories.
    append_all(&entries).unwrap_or_else(|e| unreachable!("an in-memory tar archive: {e}"))
}

fn append_all(entries: &[Entry]) -> std::io::Result<Vec<u8>> {
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header
    };
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        match entry {
            // `/tmp` is 1777 like any /tmp: the engine gives the tmpfs mounted over it the
            // mode of the image's directory.
            Entry::Dir(name) => {
                let mode = if name == "tmp" { 0o1777 } else { 0o755 };
                let mut h = header(tar::EntryType::Directory, mode, 0);
                builder.append_data(&mut h, format!("{name}/"), std::io::empty())?;
            }
            Entry::File(name, data) => {
                let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
                builder.append_data(&mut h, name, data.as_slice())?;
            }
            Entry::Link(name, target) => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                builder.append_link(&mut h, name, target)?;
            }
        }
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> SystemView {
        SystemView {
            symlinks: vec![
                ("/bin".into(), "usr/bin".into()),
                ("/lib".into(), "usr/lib".into()),
                ("/sbin".into(), "usr/sbin".into()),
            ],
            dirs: vec!["/lib64".into()],
            etc: Vec::new(),
            etc_network: Vec::new(),
        }
    }

    #[test]
    fn the_tag_names_the_content() {
        let a = RunImage::for_view(&view());
        let b = RunImage::for_view(&view());
        assert_eq!(a.tag(), b.tag(), "the same layout gives the same image");
        assert!(a.tag().starts_with("snakebox-run:"));
        let mut other = view();
        other.symlinks.pop();
        other.symlinks[0].1 = "usr/local/bin".into();
        assert_ne!(RunImage::for_view(&other).tag(), a.tag());
        assert_eq!(a.archive_bytes() % 512, 0);
        // Nothing of the build (time, owner, user names) is in the archive: this tag is the
        // same on every machine and in every process, until the image's content changes.
        assert_eq!(a.tag(), "snakebox-run:b223db65b29208be");
    }

    #[test]
    fn the_archive_has_the_links_dirs_and_users() {
        let image = RunImage::for_view(&view());
        let mut archive = tar::Archive::new(image.archive.as_slice());
        let mut names = Vec::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let h = entry.header();
            // Deterministic headers: owner, time and user names fixed.
            assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
            assert_eq!(h.mtime().unwrap(), 0);
            assert_eq!(h.username().unwrap(), Some(""));
            let kind = match h.entry_type() {
                tar::EntryType::Directory => '5',
                tar::EntryType::Symlink => '2',
                tar::EntryType::Regular => '0',
                other => panic!("{other:?}"),
            };
            names.push(format!("{kind}{}", entry.path().unwrap().display()));
            if kind == '5' && names.last().unwrap() == "5tmp/" {
                assert_eq!(h.mode().unwrap(), 0o1777);
            }
        }
        for want in [
            "5sbin/",
            "5tmp/",
            "2bin",
            "2lib",
            "5lib64/",
            "0etc/passwd",
            "0etc/group",
        ] {
            assert!(names.contains(&want.to_string()), "{want} in {names:?}");
        }
        assert!(
            !names.contains(&"2sbin".to_string()),
            "/sbin is a directory"
        );
        assert!(passwd().contains(&format!("run{LEASED_UID_BASE}:x:{LEASED_UID_BASE}:")));
        assert!(passwd().contains("sandbox:x:65534:65534:"));
    }
}
