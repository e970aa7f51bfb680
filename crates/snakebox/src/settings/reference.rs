//! The generated settings reference, `docs/src/reference/settings.md`: every flag of
//! `snakebox serve` with its environment variable, its config-file key and its help, rendered
//! from the clap definitions and [`FLAT_KEYS`]/[`SECTION_KEYS`], so it cannot drift. The test
//! fails when the committed page differs from what the code says (`SNAKEBOX_BLESS=1` rewrites
//! it), and when a flag or a config key is missing from the hand-written configuration
//! chapter, `docs/src/configuration.md`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use super::file::{FLAT_KEYS, SECTION_KEYS};
use crate::cli::Cli;

/// The config-file key a flag sets, `[section] key`, if it has one.
fn file_key(long: &str) -> Option<(&'static str, &'static str)> {
    let flat = long.replace('-', "_");
    if let Some((_, section, key)) = FLAT_KEYS.iter().find(|(f, _, _)| *f == flat) {
        return Some((section, key));
    }
    // Keys that exist only in their section: the flag is the key with `-`, a tenant's with
    // `tenant-` first; `--http ADDR` is `[http] addr`, and a repeatable flag names one item
    // of a list key.
    SECTION_KEYS.iter().copied().find(|(section, key)| {
        let dashed = key.replace('_', "-");
        match *section {
            "tenants" => long == format!("tenant-{dashed}"),
            "http" if *key == "addr" => long == "http",
            _ => long == dashed || format!("{long}s") == dashed,
        }
    })
}

fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The page, as Markdown.
fn render() -> String {
    let mut cli = Cli::command();
    cli.build();
    let serve = cli
        .find_subcommand("serve")
        .expect("`snakebox serve` exists");
    let mut out = String::from(
        "# Every setting (generated)\n\n\
         <!-- Generated from the code by `SNAKEBOX_BLESS=1 cargo test -p snakebox settings::reference`: \
         do not edit by hand. -->\n\n\
         Every flag of `snakebox serve`, with the environment variable and the config-file key that \
         set the same thing, and its help as `snakebox serve --help` prints it. The command line wins, \
         then the environment, then the file, then the default. What each setting means at length, \
         and the config file's rules, are in the [Configuration reference](../configuration.md).\n",
    );
    let mut heading = None;
    for arg in serve.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") || arg.is_hide_set() {
            continue;
        }
        let this = arg.get_help_heading().unwrap_or("Options");
        if heading != Some(this) {
            heading = Some(this);
            let _ = write!(
                out,
                "\n## {this}\n\n| flag | environment | config file | what it does |\n|---|---|---|---|\n"
            );
        }
        let env = arg
            .get_env()
            .map_or_else(|| "—".to_owned(), |e| format!("`{}`", e.to_string_lossy()));
        let key = file_key(long).map_or_else(
            || "—".to_owned(),
            |(section, key)| format!("`[{section}]` `{key}`"),
        );
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| one_line(&h.to_string()))
            .unwrap_or_default();
        let _ = writeln!(out, "| `--{long}` | {env} | {key} | {help} |");
    }
    out
}

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src")
}

#[test]
fn the_generated_settings_reference_is_current() {
    let path = docs().join("reference/settings.md");
    let rendered = render();
    if std::env::var_os("SNAKEBOX_BLESS").is_some() {
        fs_err::create_dir_all(path.parent().unwrap()).unwrap();
        fs_err::write(&path, &rendered).unwrap();
    }
    let committed = fs_err::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "{} is not what the code says; rewrite it with \
         `SNAKEBOX_BLESS=1 cargo test -p snakebox settings::reference` and commit it",
        path.display()
    );
}

#[test]
fn every_flag_and_config_key_is_in_the_configuration_chapter() {
    let chapter = fs_err::read_to_string(docs().join("configuration.md")).unwrap();
    let mut cli = Cli::command();
    cli.build();
    let serve = cli.find_subcommand("serve").unwrap();
    let mut missing = Vec::new();
    for arg in serve.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") || arg.is_hide_set() {
            continue;
        }
        if !chapter.contains(&format!("`--{long}")) {
            missing.push(format!("the flag `--{long}`"));
        }
    }
    for (section, key) in FLAT_KEYS
        .iter()
        .map(|(_, s, k)| (*s, *k))
        .chain(SECTION_KEYS.iter().copied())
    {
        let table = format!("`[{section}]` `{key}`");
        let inline = format!("[{section}] {key}");
        if !chapter.contains(&table) && !chapter.contains(&inline) {
            missing.push(format!("the config key `[{section}]` `{key}`"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/src/configuration.md does not document: {}",
        missing.join(", ")
    );
}
