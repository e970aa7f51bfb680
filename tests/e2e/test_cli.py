"""The terminal front end: `snakebox run` and `snakebox check` through the same engine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import backend_flags


def run(binary: Path, data_dir: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args, "--data-dir", str(data_dir), "--no-warm-cache", *backend_flags(args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.docker_ci
def test_run_prints_output_and_passes_the_exit_code(snakebox_bin, data_dir, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(7)\n")
    done = run(snakebox_bin, data_dir, "run", str(script))
    assert done.returncode == 7
    assert done.stdout == "to stdout\n"
    assert "to stderr" in done.stderr


def test_run_with_dep_flag_installs_the_dependency(snakebox_bin, data_dir, tmp_path):
    script = tmp_path / "six_version.py"
    script.write_text("import six\nprint(six.__version__)\n")
    done = run(snakebox_bin, data_dir, "run", str(script), "--dep", "six==1.16.0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.16.0"


def test_run_json_gives_the_structured_record(snakebox_bin, data_dir):
    done = run(snakebox_bin, data_dir, "run", "-", "--json", stdin="print(40 + 2)\n")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["status"] == "ok" and record["stdout"] == "42\n"


def test_run_timeout_exits_124_and_keeps_output(snakebox_bin, data_dir, tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('partial', flush=True)\ntime.sleep(30)\n")
    done = run(snakebox_bin, data_dir, "run", str(script), "--timeout", "1")
    assert done.returncode == 124
    assert done.stdout == "partial\n"
    assert "timeout" in done.stderr and "hint: raise --timeout" in done.stderr
    assert "timeout_seconds" not in done.stderr, done.stderr
    zero = run(snakebox_bin, data_dir, "run", str(script), "--timeout", "0")
    assert zero.returncode == 2 and "invalid value '0' for '--timeout" in zero.stderr, zero.stderr


def test_run_rejects_non_utf8_files_with_a_hint(snakebox_bin, data_dir, tmp_path):
    script = tmp_path / "latin1.py"
    script.write_bytes(b"print('caf\xe9')\n")
    done = run(snakebox_bin, data_dir, "run", str(script))
    assert done.returncode == 2
    assert "UTF-8" in done.stderr and "hint:" in done.stderr


def test_check_reports_and_exits_zero_when_ready(snakebox_bin, data_dir):
    done = run(snakebox_bin, data_dir, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "isolation active" in done.stdout
    assert "ready:     yes" in done.stdout
    # The profiles a call may name, each decision with how it is enforced.
    assert "profiles:  standard by default" in done.stdout
    assert "  basic: " in done.stdout and "subprocesses: denied (sandbox: a seccomp program" in done.stdout


@pytest.mark.native_only("a missing bwrap is the native backend's failure; the docker backend's (no engine) is test_docker's")
def test_check_gives_a_fix_hint_when_bwrap_is_missing(snakebox_bin, data_dir):
    done = run(snakebox_bin, data_dir, "check", "--bwrap-path", "/nonexistent/bwrap")
    assert done.returncode == 1
    assert "hint: nothing executable is at that path: fix `--bwrap-path`" in done.stdout, done.stdout
    assert "ready:     NO" in done.stdout


def test_reading_keys_of_a_data_dir_that_does_not_exist_is_refused_and_creates_nothing(snakebox_bin, tmp_path):
    missing = tmp_path / "typo"
    for action in (["list"], ["revoke", "k-x"]):
        done = subprocess.run([str(snakebox_bin), "keys", *action, "--data-dir", str(missing)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "does not exist, so it holds no keys" in done.stderr, done.stderr
        assert "hint: check --data-dir" in done.stderr
        assert not missing.exists()


def test_front_keypair_writes_a_private_key_only_its_owner_reads_and_replaces_nothing(snakebox_bin, tmp_path):
    out = tmp_path / "keys"
    done = subprocess.run([str(snakebox_bin), "keys", "front-keypair", "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    private, public = out / "front.key", out / "front.pub"
    assert f"wrote {private}" in done.stdout and f"wrote {public}" in done.stdout, done.stdout
    assert (private.stat().st_mode & 0o777, public.stat().st_mode & 0o777, out.stat().st_mode & 0o777) == (0o600, 0o644, 0o700)
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----\n")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----\n")
    before = private.read_bytes()
    again = subprocess.run([str(snakebox_bin), "keys", "front-keypair", "--out", str(out)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "front.key exists already" in again.stderr, again.stderr
    assert "hint: keep the existing pair" in again.stderr
    assert private.read_bytes() == before


def test_uv_path_given_as_a_bare_name_is_found_on_path(snakebox_bin, data_dir, tmp_path):
    # mcp-python-exec-sandbox documents `--uv-path uv`: a name, looked up on PATH as a shell would.
    real = shutil.which("uv") or (Path.home() / ".local/bin/uv")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").symlink_to(Path(real).resolve())
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run([str(snakebox_bin), "check", "--json", "--uv-path", "uv", "--data-dir", str(data_dir), *backend_flags()],
                          capture_output=True, text=True, timeout=120, env=env)
    report = json.loads(done.stdout)
    assert report["uv_hint"] is None and str(Path(real).resolve()) in report["uv"], report["uv"]
    missing = subprocess.run([str(snakebox_bin), "check", "--json", "--uv-path", "no-such-uv", "--data-dir", str(data_dir), *backend_flags()],
                             capture_output=True, text=True, timeout=120, env=env)
    report = json.loads(missing.stdout)
    assert "no `no-such-uv` on PATH" in report["uv"], report["uv"]


def test_check_is_not_ready_when_the_data_directory_cannot_be_made(snakebox_bin, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = subprocess.run([str(snakebox_bin), "check", "--data-dir", str(blocker / "data"), *backend_flags()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout
    assert "ready:     NO" in done.stdout
    assert f"Failed to make the store `{blocker}/data/store-v1.db`" in done.stdout, done.stdout
    assert "hint: check that the data directory (--data-dir) is writable by the server user" in done.stdout


def test_audit_refuses_an_unknown_status(snakebox_bin, data_dir):
    done = subprocess.run([str(snakebox_bin), "audit", "--status", "bogus", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "`--status bogus` is not a status of a call" in done.stderr, done.stderr
    assert "memory_limit" in done.stderr and "running" in done.stderr


def test_config_file_and_environment_variables_are_read(snakebox_bin, data_dir, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("max_timeout = 77\n")
    done = subprocess.run(
        [str(snakebox_bin), "check", "--json", "--config", str(config), "--data-dir", str(data_dir), *backend_flags()],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "SNAKEBOX_DEFAULT_TIMEOUT": "11", "HOME": str(tmp_path)},
    )
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert report["timeouts"] == "default 11 s, maximum 77 s"


def test_bad_config_values_fail_with_a_hint(snakebox_bin, data_dir, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("memory_limit = \"lots\"\n")
    done = run(snakebox_bin, data_dir, "check", "--config", str(config))
    assert done.returncode == 2
    assert "memory-limit" in done.stderr and "hint" in done.stderr


# One setting per section, written both ways; `network` stays off so the report holds no
# host-dependent network probe.
SECTIONED_CONFIG = """\
[server]
max_concurrent_runs = 3

[python]
uv_path = "{uv}"

[network]
mode = "off"

[limits]
max_timeout = 77
default_timeout = 11
memory = "256MiB"
processes = 64
cpu_cores = 0.5
scratch = "64MiB"

[pool]
size = 3
fork_server = "off"

[cache]
no_warm = true
max_size = "2GiB"
max_age_days = 3

[sessions]
idle_stop = 60
max_sessions = 4
max_interpreters = 2

[artifacts]
max_age_hours = 2
"""

FLAT_CONFIG = """\
max_concurrent_runs = 3
uv_path = "{uv}"
network = "off"
max_timeout = 77
default_timeout = 11
memory_limit = "256MiB"
max_processes = 64
cpu_cores = 0.5
scratch_limit = "64MiB"
warm_pool = 3
fork_server = "off"
no_warm_cache = true
cache_max_size = "2GiB"
cache_max_age_days = 3
session_idle_stop = 60
max_sessions = 4
session_max_interpreters = 2
artifact_max_age_hours = 2
"""


def check_json(binary: Path, data_dir: Path, config: Path) -> tuple[int, dict]:
    done = subprocess.run(
        [str(binary), "check", "--json", "--config", str(config), "--data-dir", str(data_dir), *backend_flags()],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_sectioned_and_flat_config_files_give_the_same_report(snakebox_bin, data_dir, tmp_path):
    uv = shutil.which("uv") or "/usr/bin/false"
    sectioned = tmp_path / "sectioned.toml"
    sectioned.write_text(SECTIONED_CONFIG.format(uv=uv))
    flat = tmp_path / "flat.toml"
    flat.write_text(FLAT_CONFIG.format(uv=uv))
    sectioned_code, sectioned_report = check_json(snakebox_bin, data_dir, sectioned)
    flat_code, flat_report = check_json(snakebox_bin, data_dir, flat)
    assert (sectioned_code, sectioned_report) == (flat_code, flat_report)
    # And the file was read: these are not the defaults.
    assert sectioned_report["timeouts"] == "default 11 s, maximum 77 s"
    assert sectioned_report["warm_pool"]["size"] == 3
    assert sectioned_report["sessions"]["max_sessions"] == 4


def test_flat_key_and_its_sectioned_twin_both_set_is_refused(snakebox_bin, data_dir, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("max_timeout = 60\n[limits]\nmax_timeout = 90\n")
    done = run(snakebox_bin, data_dir, "check", "--config", str(config))
    assert done.returncode == 2
    assert "`max_timeout` and `[limits] max_timeout`" in done.stderr and "hint:" in done.stderr


def test_unknown_sectioned_key_gets_a_did_you_mean(snakebox_bin, data_dir, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[limits]\nmemroy = \"1GiB\"\n")
    done = run(snakebox_bin, data_dir, "check", "--config", str(config))
    assert done.returncode == 2
    assert "unknown key `memroy` in `[limits]`" in done.stderr
    assert "hint: did you mean `memory`?" in done.stderr


def test_flag_beats_environment_beats_sectioned_file(snakebox_bin, data_dir, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[limits]\ndefault_timeout = 5\nmax_timeout = 77\n[sessions]\nmax_sessions = 6\n")
    done = subprocess.run(
        [str(snakebox_bin), "check", "--json", "--config", str(config), "--data-dir", str(data_dir),
         "--max-sessions", "9", *backend_flags()],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "SNAKEBOX_DEFAULT_TIMEOUT": "11", "SNAKEBOX_MAX_SESSIONS": "8",
             "HOME": str(tmp_path)},
    )
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert report["timeouts"] == "default 11 s, maximum 77 s"
    assert report["sessions"]["max_sessions"] == 9


@pytest.mark.parametrize("version", ["3.99", "banana"])
def test_a_default_python_that_is_not_here_is_refused_at_start(snakebox_bin, data_dir, version):
    """issue 16 (8): the server started and `check` said ready, then every call failed."""
    checked = run(snakebox_bin, data_dir, "check", "--python-version", version)
    assert checked.returncode == 1, checked.stdout
    assert "ready:     NO" in checked.stdout
    assert "default Python (--python-version or [python] version) is not usable" in checked.stdout
    served = subprocess.run(
        [str(snakebox_bin), "serve", "--data-dir", str(data_dir), "--python-version", version, *backend_flags()],
        input="", capture_output=True, text=True, timeout=60,
    )
    assert served.returncode != 0
    assert "is not usable" in served.stderr and "hint: " in served.stderr, served.stderr
