//! One install pipeline for the environment cache and for sessions.
//!
//! Both install requirements the same way, with the same isolation per step (see the `install`
//! module): the venv made by trusted uv; wheels downloaded and unpacked by trusted uv as the
//! installer ([`Role::Downloader`]), reaching the network only through the egress proxy;
//! byte-compilation as package code ([`Role::PackageCode`]: a run's identity and limits, no
//! network, no credentials, uv's cache not mounted), the environment handed to that identity
//! for the step only; every installed file checked against its `RECORD`; damaged packages
//! removed from uv's cache. [`InstallPipeline`] builds each step's invocation and runs the
//! steps whose handling does not depend on the caller, so that a rule for one of them is
//! written once.
//!
//! What stays with each caller is what really differs: the cache builds a fresh, relocatable
//! venv in a build directory, downloads into it (hard links when package code runs as another
//! uid), may build sdists, and publishes the result or nothing; a session installs into its
//! existing venv incrementally (as the prefix of the base interpreter, so that uv never queries
//! the venv's own interpreter), streams uv's progress, repairs what it can, and reports
//! failures in its own terms.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use snakebox_sandbox::{EgressProxy, Identity, Limits};

use crate::error::EnvError;
use crate::install::{
    COMPILE_LABEL, PACKAGE_CODE_CWD, compile_args, hand_to_package_code, site_packages,
    take_back_from_package_code,
};
use crate::uv::{Egress, PackageIdentity, Role, Uv, UvInvocation, UvOutput, UvRunner};
use crate::verify::{Mismatch, check_records};
use crate::{Interpreter, UvEnvironment};

/// What every step of one install needs: uv, its settings, the base interpreter, uv's cache
/// and the wall time of each step.
#[derive(Debug, Clone)]
pub struct InstallPipeline<'a> {
    /// The uv binary.
    pub uv: &'a Uv,
    /// The operator's index, proxy and certificate settings.
    pub uv_env: &'a UvEnvironment,
    /// The base interpreter the environment is made from.
    pub interpreter: &'a Interpreter,
    /// uv's shared cache (writable by the downloader only).
    pub uv_cache: PathBuf,
    /// The wall time of each step.
    pub timeout: Duration,
    /// The CPU share of the slot its steps run in (see [`UvInvocation::cpu`]); `None`: the
    /// default weight.
    pub cpu: Option<snakebox_sandbox::CpuShare>,
}

/// A downloader invocation with the egress proxy it reaches the network through (kept alive
/// while the invocation runs; dropping it stops the proxy).
#[derive(Debug)]
pub struct DownloaderStep {
    /// What to run.
    pub invocation: UvInvocation,
    proxy: Option<EgressProxy>,
}

impl DownloaderStep {
    /// When the step failed, add what the install proxy refused to its stderr (uv itself
    /// only saw a 403 or a closed connection). Returns whether it refused anything.
    pub fn explain_refusals(&self, output: &mut UvOutput) -> bool {
        let Some(proxy) = &self.proxy else {
            return false;
        };
        let before = output.stderr.len();
        crate::uv::explain_refusals(proxy, output);
        output.stderr.len() != before
    }

    /// Whether the step goes through an egress proxy.
    #[must_use]
    pub fn has_proxy(&self) -> bool {
        self.proxy.is_some()
    }
}

/// Where a download unpacks its wheels.
#[derive(Debug, Clone, Copy)]
pub enum DownloadTarget<'p> {
    /// Into a fresh, empty venv, through its interpreter (its path): nothing in it can run.
    FreshVenv(&'p Path),
    /// Into an existing venv (its directory) as the prefix of the base interpreter, which uv
    /// queries instead of the venv's (whose packages' `.pth` files would run in uv).
    Prefix(&'p Path),
}

impl InstallPipeline<'_> {
    /// Arguments of `uv venv` for `dir` from the base interpreter; `relocatable` for a venv
    /// that is renamed after it is built.
    #[must_use]
    pub fn venv_args(&self, dir: &Path, relocatable: bool) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["venv".into()];
        if relocatable {
            args.push("--relocatable".into());
        }
        args.extend([
            "--no-project".into(),
            "--python".into(),
            self.interpreter.executable.clone().into(),
            dir.into(),
        ]);
        args
    }

    /// Arguments of the download step: wheels only, no bytecode compilation (both run package
    /// code); `requirements` as uv takes them (`-r FILE`, or the requirement strings).
    #[must_use]
    pub fn download_args(
        &self,
        target: DownloadTarget<'_>,
        link_mode: &str,
        requirements: impl IntoIterator<Item = OsString>,
    ) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["pip".into(), "install".into(), "--python".into()];
        match target {
            DownloadTarget::FreshVenv(python) => args.push(python.into()),
            DownloadTarget::Prefix(venv) => args.extend([
                self.interpreter.executable.clone().into(),
                "--prefix".into(),
                venv.into(),
            ]),
        }
        args.extend([
            "--link-mode".into(),
            link_mode.into(),
            // No sdist is built here: building runs the package's code.
            "--no-build".into(),
        ]);
        args.extend(requirements);
        args
    }

    /// Arguments that remove `packages` from uv's cache (after their installed files were
    /// found damaged, so that the next install downloads them again).
    #[must_use]
    pub fn cache_clean_args(packages: &[String]) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["cache".into(), "clean".into()];
        args.extend(packages.iter().map(Into::into));
        args
    }

    /// A step of trusted uv ([`Role::Downloader`]) in `cwd`, writing only `writable`. With
    /// `network` and a `sandboxed` installer, it reaches the configured indexes and public
    /// addresses only, through an egress proxy started here; its sandbox keeps its own network
    /// namespace (catalogue D-02). Unsandboxed, or when the operator's proxy cannot be
    /// chained, it has the host network.
    ///
    /// # Errors
    /// When the egress proxy cannot be started.
    pub fn downloader(
        &self,
        label: &str,
        args: Vec<OsString>,
        cwd: &Path,
        writable: Vec<PathBuf>,
        network: bool,
        sandboxed: bool,
    ) -> std::io::Result<DownloaderStep> {
        let rules = if network && sandboxed {
            self.uv_env.egress_rules()
        } else {
            None
        };
        let proxy = rules.as_ref().map(EgressProxy::start).transpose()?;
        let invocation = UvInvocation {
            program: self.uv.path.clone(),
            args,
            env: self.uv_env.for_uv(&self.uv_cache),
            cwd: cwd.to_path_buf(),
            network,
            read_only: crate::uv::install_read_only_paths(
                self.uv,
                self.interpreter,
                self.uv_env,
                network,
            ),
            writable,
            timeout: self.timeout,
            label: label.to_owned(),
            role: Role::Downloader,
            egress: proxy.as_ref().map(|proxy| Egress {
                socket: proxy.path().to_path_buf(),
                python: self.interpreter.executable.clone(),
            }),
            cpu: self.cpu.clone(),
        };
        Ok(DownloaderStep { invocation, proxy })
    }

    /// A step that runs package code ([`Role::PackageCode`]): `identity` and `limits`, no
    /// network, no credentials, `HOME` and the working directory in its scratch, only `env`
    /// writable, never uv's cache; `extra_read_only` besides what every install step reads.
    #[allow(clippy::too_many_arguments)]
    #[must_use]
    pub fn package_code(
        &self,
        label: &str,
        program: PathBuf,
        args: Vec<OsString>,
        env: &Path,
        extra_read_only: Vec<PathBuf>,
        identity: Identity,
        limits: Limits,
    ) -> UvInvocation {
        let mut read_only =
            crate::uv::install_read_only_paths(self.uv, self.interpreter, self.uv_env, false);
        read_only.extend(extra_read_only);
        UvInvocation {
            program,
            args,
            env: UvEnvironment::for_package_code(),
            cwd: PathBuf::from(PACKAGE_CODE_CWD),
            network: false,
            read_only,
            writable: vec![env.to_path_buf()],
            timeout: self.timeout,
            label: label.to_owned(),
            role: Role::PackageCode { identity, limits },
            egress: None,
            cpu: self.cpu.clone(),
        }
    }

    /// The invocation that byte-compiles `env` (`None` when it has no `site-packages`): the
    /// environment's own interpreter, as package code (see [`Self::package_code`]); prepare
    /// `env` with [`hand_to_package_code`] first.
    #[must_use]
    pub fn compile_invocation(
        &self,
        env: &Path,
        identity: Identity,
        limits: Limits,
    ) -> Option<UvInvocation> {
        let site_packages = site_packages(env)?;
        Some(self.package_code(
            COMPILE_LABEL,
            env.join("bin").join("python"),
            compile_args(&site_packages),
            env,
            Vec::new(),
            identity,
            limits,
        ))
    }

    /// Byte-compile `env` as package code through `runner`: its directories handed to
    /// `identity` for the step (its files stay unwritable by it), then, with `give_back_to`,
    /// everything given to those ids again, whatever the step did. `None` when there was
    /// nothing to compile. A non-zero exit is not an error here: the caller judges the output
    /// (a file that does not compile is not an error; damaged `.pyc` files or a full disk are).
    ///
    /// # Errors
    /// When the environment cannot be handed over or back, the step cannot run, or it
    /// reached its time or another limit ([`EnvError::Timeout`], [`EnvError::LimitReached`]).
    pub async fn compile(
        &self,
        runner: &dyn UvRunner,
        env: &Path,
        identity: &PackageIdentity,
        limits: Limits,
        give_back_to: Option<(u32, u32)>,
    ) -> Result<Option<UvOutput>, EnvError> {
        let ids = identity.host_ids;
        blocking_io("prepare the environment for compiling", env, move |env| {
            hand_to_package_code(env, ids)
        })
        .await?;
        let output = match self.compile_invocation(env, identity.identity, limits) {
            Some(invocation) => Some(runner.run(&invocation).await),
            None => None,
        };
        if let Some(ids) = give_back_to {
            blocking_io(
                "take the environment back after compiling",
                env,
                move |env| take_back_from_package_code(env, ids),
            )
            .await?;
        }
        output.transpose()
    }

    /// Check every file installed in `env` against its distribution's `RECORD` (host code
    /// reading files beneath it, executing nothing): what is damaged or missing.
    ///
    /// # Errors
    /// When the environment cannot be read.
    pub async fn verify(env: &Path) -> Result<Vec<Mismatch>, EnvError> {
        let Some(site) = site_packages(env) else {
            return Ok(Vec::new());
        };
        blocking_io("verify the installed packages in", &site, |site| {
            check_records(site)
        })
        .await
    }

    /// The names of the distributions `mismatches` belong to (for [`Self::cache_clean_args`]),
    /// in order, without adjacent repeats.
    #[must_use]
    pub fn damaged_distributions(mismatches: &[Mismatch]) -> Vec<String> {
        let mut names: Vec<String> = mismatches
            .iter()
            .map(|m| {
                m.distribution
                    .rsplit_once('-')
                    .map_or(m.distribution.as_str(), |(name, _)| name)
                    .to_owned()
            })
            .collect();
        names.dedup();
        names
    }
}

/// Run file-system work on `path` off the async threads; its error names the action and path.
async fn blocking_io<R: Send + 'static>(
    action: &'static str,
    path: &Path,
    work: impl FnOnce(&Path) -> std::io::Result<R> + Send + 'static,
) -> Result<R, EnvError> {
    let owned = path.to_path_buf();
    let io = |source| EnvError::Io {
        action,
        path: path.to_path_buf(),
        source,
    };
    tokio::task::spawn_blocking(move || work(&owned))
        .await
        .map_err(|err| io(std::io::Error::other(err)))?
        .map_err(io)
}

/// The interpreter of a venv at `dir` (for [`DownloadTarget::FreshVenv`]).
#[must_use]
pub fn venv_python(dir: &Path) -> PathBuf {
    dir.join("bin").join("python")
}

/// `-r FILE`, the requirements of a download read from a file.
#[must_use]
pub fn requirements_file_args(file: &Path) -> Vec<OsString> {
    vec!["-r".into(), OsStr::new(file).to_owned()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr as _;

    fn parts() -> (Uv, UvEnvironment, Interpreter) {
        let uv = Uv {
            path: PathBuf::from("/opt/uv/uv"),
            version: "0.9.0".into(),
        };
        let interpreter = Interpreter {
            version: pep440_rs::Version::from_str("3.12.1").unwrap(),
            executable: PathBuf::from("/py/bin/python3.12"),
            prefix: PathBuf::from("/py"),
            implementation: "CPython".into(),
            source: "system".into(),
        };
        (uv, UvEnvironment::from_vars(Vec::new()), interpreter)
    }

    fn pipeline<'a>(
        uv: &'a Uv,
        uv_env: &'a UvEnvironment,
        interpreter: &'a Interpreter,
    ) -> InstallPipeline<'a> {
        InstallPipeline {
            uv,
            uv_env,
            interpreter,
            uv_cache: PathBuf::from("/data/uv-cache"),
            timeout: Duration::from_secs(60),
            cpu: None,
        }
    }

    fn argv(args: &[OsString]) -> Vec<&str> {
        args.iter().map(|a| a.to_str().unwrap_or("?")).collect()
    }

    #[test]
    fn each_caller_gets_the_arguments_it_had() {
        let (uv, uv_env, interpreter) = parts();
        let pipeline = pipeline(&uv, &uv_env, &interpreter);
        // The environment cache: a fresh, relocatable venv, downloaded into from a file.
        assert_eq!(
            argv(&pipeline.venv_args(Path::new("/b/env"), true)),
            [
                "venv",
                "--relocatable",
                "--no-project",
                "--python",
                "/py/bin/python3.12",
                "/b/env"
            ]
        );
        let python = venv_python(Path::new("/b/env"));
        assert_eq!(
            argv(&pipeline.download_args(
                DownloadTarget::FreshVenv(&python),
                "hardlink",
                requirements_file_args(Path::new("/b/requirements.txt")),
            )),
            [
                "pip",
                "install",
                "--python",
                "/b/env/bin/python",
                "--link-mode",
                "hardlink",
                "--no-build",
                "-r",
                "/b/requirements.txt"
            ]
        );
        // A session: its venv, installed into as the base interpreter's prefix.
        assert_eq!(
            argv(&pipeline.venv_args(Path::new("/s/venv"), false)),
            [
                "venv",
                "--no-project",
                "--python",
                "/py/bin/python3.12",
                "/s/venv"
            ]
        );
        assert_eq!(
            argv(&pipeline.download_args(
                DownloadTarget::Prefix(Path::new("/s/venv")),
                "copy",
                ["six==1.16.0".into()],
            )),
            [
                "pip",
                "install",
                "--python",
                "/py/bin/python3.12",
                "--prefix",
                "/s/venv",
                "--link-mode",
                "copy",
                "--no-build",
                "six==1.16.0"
            ]
        );
        assert_eq!(
            argv(&InstallPipeline::cache_clean_args(&[
                "a".into(),
                "b".into()
            ])),
            ["cache", "clean", "a", "b"]
        );
    }

    #[test]
    fn downloads_without_network_or_sandbox_get_no_proxy() {
        let (uv, uv_env, interpreter) = parts();
        let pipeline = pipeline(&uv, &uv_env, &interpreter);
        for (network, sandboxed) in [(false, true), (true, false), (false, false)] {
            let step = pipeline
                .downloader(
                    "uv",
                    Vec::new(),
                    Path::new("/b"),
                    Vec::new(),
                    network,
                    sandboxed,
                )
                .unwrap();
            assert!(!step.has_proxy());
            assert_eq!(step.invocation.role, Role::Downloader);
            assert_eq!(step.invocation.network, network);
        }
        let code = pipeline.package_code(
            "x",
            PathBuf::from("/b/env/bin/python"),
            Vec::new(),
            Path::new("/b/env"),
            Vec::new(),
            Identity::Untrusted,
            crate::BuildSettings::default().limits,
        );
        assert!(!code.network);
        assert_eq!(code.writable, [PathBuf::from("/b/env")]);
        assert!(!code.read_only.contains(&PathBuf::from("/data/uv-cache")));
        assert!(
            code.env.iter().all(|(name, _)| name != "UV_CACHE_DIR"),
            "package code never sees uv's cache"
        );
    }
}
