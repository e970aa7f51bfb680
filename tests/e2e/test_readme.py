"""The README's commands, as a new user meets them (issue 36): run as a fresh normal user on a
clean home and data directory, each prints what the README shows or connects the real client.

- the terminal session at the top: `snakebox run examples/hello.py` and the piped script print
  the lines the README shows (the Python version is the host's);
- "Connect your agent": `snakebox client-config claude-code | sh` registers snakebox with Claude
  Code; each command of the by-hand block (Claude Code, Gemini CLI) registers it; the Codex and
  JSON entries, given to Claude Code as they are (`claude mcp add-json`), start it; the HTTP
  block (a key, a server, Claude Code with the key) connects. Each judged by the client's own
  health check (`mcp list` says Connected).

The quick start's two commands are not run here: the first builds the release binary (CI's
machine runs it before the suite), the second is this suite.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from conftest import have_bwrap
from host_support import normal_user, real_uv
from http_support import free_port

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "target" / "clients" / "node_modules" / ".bin"
USER = "snakebox-readme"

pytestmark = [
    pytest.mark.native_only("a normal user's server is the native backend's"),
    pytest.mark.skipif(os.geteuid() != 0, reason="creating a test user needs root"),
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
    pytest.mark.skipif(shutil.which("useradd") is None or shutil.which("runuser") is None, reason="useradd/runuser missing"),
]


def readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def blocks(section: str) -> list[tuple[str, str]]:
    """The fenced blocks of `section`: (language, body)."""
    return re.findall(r"```(\w*)\n(.*?)```", section, re.S)


@pytest.fixture(scope="module")
def user(snakebox_bin: Path) -> Iterator[tuple[pwd.struct_passwd, Path]]:
    """A fresh user with snakebox and uv in `~/bin` (the checkout and uv may live where a
    normal user cannot go) and the examples in its home."""
    if not os.access(CLIENTS / "claude", os.X_OK) or not (CLIENTS / "gemini").exists():
        pytest.fail("the real MCP clients are not installed: run scripts/install-clients")
    with normal_user(USER) as entry:
        home = Path(entry.pw_dir)
        tools = home / "bin"
        tools.mkdir(mode=0o755)
        shutil.copy2(real_uv(), tools / "uv")
        shutil.copy2(snakebox_bin, tools / "snakebox")
        shutil.copytree(REPO / "examples", home / "examples")
        subprocess.run(["chown", "-R", f"{USER}:", str(home)], check=True)
        probe = as_user(entry, home, f"test -x {CLIENTS / 'claude'}", home)
        if probe.returncode != 0:
            pytest.skip(f"a normal user cannot reach the clients under {CLIENTS} (a checkout under /root?)")
        yield entry, tools


def as_user(entry: pwd.struct_passwd, home: Path, command: str, cwd: Path, timeout: int = 300, **extra: str) -> subprocess.CompletedProcess[str]:
    """`command` in `sh` as the user, with HOME `home` and only its tools and the clients on PATH."""
    env = {
        "HOME": str(home),
        "PATH": f"{Path(entry.pw_dir) / 'bin'}:{CLIENTS}:/usr/bin:/bin",
        "NO_COLOR": "1",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        **extra,
    }
    return subprocess.run(
        ["runuser", "-u", entry.pw_name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), "sh", "-c", command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def fresh_home(entry: pwd.struct_passwd, name: str) -> Path:
    """A clean HOME of the user's for one block: no client config, no data directory."""
    home = Path(entry.pw_dir) / name
    home.mkdir(mode=0o700)
    shutil.chown(home, entry.pw_uid, entry.pw_gid)
    return home


def connected(listing: str, name: str) -> bool:
    return any(line.startswith(f"{name}:") or f" {name}:" in line for line in listing.splitlines() if "Connected" in line)


def test_the_terminal_session_prints_what_the_readme_shows(user: tuple[pwd.struct_passwd, Path]):
    entry, _ = user
    intro = (REPO / "README.md").read_text().split("\n## ", 1)[0]
    [console] = [body for language, body in blocks(intro) if language == "console"]
    # Each `$ command` with the lines the README shows after it.
    steps = re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", console, re.M)
    assert len(steps) == 2, console
    home = Path(entry.pw_dir)
    for command, shown in steps:
        done = as_user(entry, home, command, home)
        printed = (done.stdout + done.stderr).splitlines()
        # The lines shown, in order; `...` stands for lines left out, a version for the host's.
        position = 0
        for line in shown.splitlines():
            if line.strip() == "...":
                continue
            pattern = re.escape(line).replace(re.escape("3.13.0"), r"3\.\d+\.\d+")
            found = next((i for i in range(position, len(printed)) if re.fullmatch(pattern, printed[i])), None)
            assert found is not None, f"`{command}` did not print {line!r} (in order); it printed:\n" + "\n".join(printed)
            position = found + 1


def test_client_config_registers_snakebox_with_claude_code(user: tuple[pwd.struct_passwd, Path]):
    entry, tools = user
    section = readme_section("Connect your agent")
    command = re.search(r"`(snakebox client-config claude-code \| sh)`", section)
    assert command, "the README shows client-config piped to sh"
    home = fresh_home(entry, "client-config")
    added = as_user(entry, home, command.group(1), home)
    assert added.returncode == 0, added.stdout + added.stderr
    listed = as_user(entry, home, "claude mcp list", home)
    assert connected(listed.stdout, "snakebox"), listed.stdout + listed.stderr
    assert str(tools / "snakebox") in listed.stdout, "registered by the binary's absolute path"


def test_each_by_hand_entry_starts_snakebox_in_its_client(user: tuple[pwd.struct_passwd, Path]):
    entry, tools = user
    found = blocks(readme_section("Connect your agent"))
    by_hand = next(body for language, body in found if language == "sh" and "claude mcp add --scope user" in body)
    home = fresh_home(entry, "by-hand")
    for line in by_hand.splitlines():
        if line.strip() and not line.startswith("#"):
            done = as_user(entry, home, line, home)
            assert done.returncode == 0, (line, done.stdout, done.stderr)
    claude = as_user(entry, home, "claude mcp list", home)
    assert connected(claude.stdout, "snakebox"), claude.stdout + claude.stderr
    gemini = as_user(entry, home, "gemini mcp list", home)
    assert connected(gemini.stdout + gemini.stderr, "snakebox"), gemini.stdout + gemini.stderr

    # The Codex and JSON entries, with the README's example path made this user's binary.
    codex = tomllib.loads(next(body for language, body in found if language == "toml"))["mcp_servers"]["snakebox"]
    desktop = json.loads(next(body for language, body in found if language == "json"))["mcpServers"]["snakebox"]
    assert codex["command"] == desktop["command"] == "/usr/local/bin/snakebox"
    home = fresh_home(entry, "entries")
    for name, server in (("codex", codex), ("desktop", desktop)):
        entry_json = json.dumps({"command": str(tools / "snakebox"), "args": server["args"]})
        done = as_user(entry, home, f"claude mcp add-json --scope user {name} '{entry_json}'", home)
        assert done.returncode == 0, done.stdout + done.stderr
    listed = as_user(entry, home, "claude mcp list", home)
    assert connected(listed.stdout, "codex") and connected(listed.stdout, "desktop"), listed.stdout


def test_the_http_block_serves_a_key_and_claude_code_connects_with_it(user: tuple[pwd.struct_passwd, Path]):
    entry, _ = user
    found = blocks(readme_section("Connect your agent"))
    http = next(body for language, body in found if language == "sh" and "keys add" in body)
    lines = [line.split("  #", 1)[0].strip() for line in http.splitlines() if line.strip()]
    keys_add, serve, claude_add = lines
    assert keys_add.startswith("snakebox keys add") and serve.startswith("snakebox serve --http 127.0.0.1:8000")
    home = fresh_home(entry, "http")
    made = as_user(entry, home, keys_add, home)
    assert made.returncode == 0, made.stdout + made.stderr
    key = made.stdout.strip().splitlines()[-1]
    assert key.startswith("sbx_"), made.stdout

    port = free_port()
    command = ["runuser", "-u", entry.pw_name, "--", "env", "-i", f"HOME={home}", f"PATH={Path(entry.pw_dir) / 'bin'}:/usr/bin:/bin", "sh", "-c", f"exec {serve.replace(':8000', f':{port}')}"]
    server = subprocess.Popen(command, cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        add = claude_add.replace(":8000", f":{port}").replace("sbx_…", key)
        done = as_user(entry, home, add, home)
        assert done.returncode == 0, done.stdout + done.stderr
        listed = as_user(entry, home, "claude mcp list", home)
        assert connected(listed.stdout, "snakebox"), listed.stdout + listed.stderr
        # Without the key, the same server refuses: the connection above was the key's.
        refused = as_user(entry, home, add.replace(key, "sbx_not-a-key").replace(" snakebox ", " nokey ", 1), home)
        assert refused.returncode == 0, refused.stdout + refused.stderr
        listed = as_user(entry, home, "claude mcp list", home)
        assert not connected(listed.stdout, "nokey"), listed.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
