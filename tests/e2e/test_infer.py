"""Dependencies from imports (issue 36, `--infer-dependencies`), through the real binary and uv.

- with it, a one-shot run that imports a package on snakebox's list without declaring it gets
  that package installed and runs, its notes saying what was added and how to choose the
  version; a declared requirement is used as declared (no note);
- an import off the list is never installed (a typosquat's bait fails as before);
- the `basic` profile allows no packages: nothing is added, the import fails as it would have;
- a session cell's import is installed into the session once (the next cell adds nothing);
- without the flag nothing is inferred (the import fails), and `check_environment` says which.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import call, connect, have_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

IMPORTS = "import tabulate\nprint(tabulate.tabulate([[1, 2]]))\n"


def inferred(result: dict) -> list[str]:
    return [note for note in result["notes"] or [] if "infers dependencies" in note]


async def test_a_well_known_import_gets_its_package_and_a_note(snakebox_bin: Path, tmp_path: Path):
    async with connect(snakebox_bin, tmp_path / "data", "auto", "--infer-dependencies") as client:
        report, _, _ = await call(client, "check_environment")
        assert report["infer_dependencies"] is True

        result, text, _ = await call(client, "execute_python", script=IMPORTS)
        assert result["status"] == "ok", text
        assert "1  2" in result["stdout"], text
        assert result["requested_dependencies"] == ["tabulate"], text
        notes = inferred(result)
        assert len(notes) == 1 and "added tabulate for `import tabulate` (line 1)" in notes[0], notes
        assert "`# /// script`" in notes[0], "the note says how to choose the version"

        declared, text, _ = await call(client, "execute_python", script=IMPORTS, dependencies=["tabulate==0.9.0"])
        assert declared["status"] == "ok", text
        assert declared["requested_dependencies"] == ["tabulate==0.9.0"], text
        assert inferred(declared) == [], declared["notes"]

        bait, text, _ = await call(client, "execute_python", script="import tabulat\n")
        assert bait["status"] == "error" and "ModuleNotFoundError" in bait["stderr"], text
        assert bait["requested_dependencies"] == [] and inferred(bait) == [], text

        basic, text, _ = await call(client, "execute_python", script=IMPORTS, profile="basic")
        assert basic["status"] != "ok", text
        assert basic["requested_dependencies"] == [] and inferred(basic) == [], text

        session, text, _ = await call(client, "create_session")
        sid = session["session_id"]
        cell, text, _ = await call(client, "execute_python", script=IMPORTS, session_id=sid)
        assert cell["status"] == "ok", text
        assert len(inferred(cell)) == 1, cell["notes"]
        packages, text, _ = await call(client, "list_packages", session_id=sid)
        assert "tabulate" in [p["name"] for p in packages["packages"]], text
        again, text, _ = await call(client, "execute_python", script=IMPORTS, session_id=sid)
        assert again["status"] == "ok" and inferred(again) == [], again["notes"]


async def test_without_the_flag_nothing_is_inferred(snakebox_bin: Path, tmp_path: Path):
    async with connect(snakebox_bin, tmp_path / "data", "auto") as client:
        report, _, _ = await call(client, "check_environment")
        assert report["infer_dependencies"] is False
        result, text, _ = await call(client, "execute_python", script=IMPORTS)
        assert result["status"] == "error" and "ModuleNotFoundError" in result["stderr"], text
        assert inferred(result) == [], text
