#!/usr/bin/env python3
"""Check every link of the documentation that stays inside this repository.

mdBook itself fails on a chapter missing from `SUMMARY.md`, but not on a link to a page or a
heading that does not exist. This does: for the book's pages (`docs/src`, with their
`{{#include}}`s expanded) and the Markdown files at the repository's root, every relative link
must name a file that exists, and a `#anchor` on a Markdown file must name one of its headings
(ids made as mdBook and GitHub make them). Links with a scheme (`https:`) are not fetched.
Every page under `docs/src` must also be listed in `SUMMARY.md`. With `--html DIR` (the book
built by `mdbook build docs`, `target/book`), every link in the built pages must also reach a
page of the site and one of its ids: what a reader of the site follows, `{{#include}}`d pages
included.

    python3 docs/check_links.py                     # exit 1, one line per broken link
    python3 docs/check_links.py --html target/book  # and the built site's links
"""

from __future__ import annotations

import html
import re
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "docs" / "src"
# Markdown files outside the book whose links are checked too.
REPO_PAGES = [
    "README.md",
    "BENCHMARKS.md",
    "SECURITY.md",
    "ARCHITECTURE.md",
    "RELIABILITY.md",
    "bench/README.md",
    "scripts/guest/README.md",
]

INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")
# [text](target) and ![alt](target); the text may hold one level of brackets (`[a [b]](c)`).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def lines_of(path: Path) -> list[tuple[str, Path]]:
    """The file's lines with `{{#include}}`s expanded, each with the file it came from."""
    out: list[tuple[str, Path]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = INCLUDE.search(line)
        if match:
            included = (path.parent / match.group(1)).resolve()
            if not included.is_file():
                out.append((f"[missing include]({match.group(1)})", path))
                continue
            out.extend(lines_of(included))
        else:
            out.append((line, path))
    return out


def prose(lines: list[tuple[str, Path]]):
    """Lines outside fenced code blocks, with inline code spans blanked."""
    fenced = False
    for number, (line, origin) in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        yield number, re.sub(r"`+[^`]*`+", lambda m: " " * len(m.group(0)), line), line, origin


def heading_id(text: str) -> str:
    """A heading's id, as mdBook's `normalize_id` (and GitHub) make it from its text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text)
    return "".join(
        ch.lower() if ch.isalnum() or ch in "_-" else "-" if ch.isspace() else ""
        for ch in text
    )


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    ids = set()
    for _, _, raw, _ in prose(lines_of(path)):
        match = HEADING.match(raw)
        if not match:
            continue
        base = heading_id(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        ids.add(base if count == 0 else f"{base}-{count}")
    # Explicit anchors (`<a id="x">`, `{#x}`).
    text = "\n".join(line for line, _ in lines_of(path))
    ids.update(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", text))
    ids.update(re.findall(r"\{#([\w-]+)\}", text))
    return frozenset(ids)


def check(page: Path) -> list[str]:
    problems = []
    for number, line, _, origin in prose(lines_of(page)):
        for match in LINK.finditer(line):
            target = match.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # https:, mailto: …: not checked here
            where = f"{page.relative_to(ROOT)}:{number}"
            if origin != page:
                where += f" (from {origin.relative_to(ROOT)})"
            path_part, _, anchor = target.partition("#")
            resolved = (origin.parent / path_part).resolve() if path_part else page
            if path_part and not resolved.exists():
                problems.append(f"{where}: `{target}`: no such file `{resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}`")
                continue
            if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: `{target}`: no heading with the id `{anchor}` in `{resolved.relative_to(ROOT)}`")
    return problems


def check_html(site: Path) -> list[str]:
    """Links inside the built pages' `<main>`: each must reach a file of the site and, with a
    `#fragment`, an id of that page."""
    pages = {page.resolve(): page.read_text(encoding="utf-8") for page in site.rglob("*.html")}
    ids = {page: set(re.findall(r'\bid="([^"]+)"', text)) for page, text in pages.items()}
    problems = []
    for page, text in sorted(pages.items()):
        if page.name in ("print.html", "404.html", "toc.html"):
            continue  # the print page repeats every chapter; the others are mdBook's own
        main = text[text.find("<main>") : text.find("</main>")]
        for href in re.findall(r'href="([^"]+)"', main):
            href = html.unescape(href)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", href):
                continue
            path_part, _, anchor = href.partition("#")
            target = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.relative_to(site.resolve())} (built)"
            if not target.exists():
                problems.append(f"{where}: `{href}`: no such file in the site")
            elif anchor and target.suffix == ".html" and anchor not in ids.get(target, set()):
                problems.append(f"{where}: `{href}`: no element with the id `{anchor}`")
    return problems


def main() -> int:
    problems: list[str] = []
    pages = sorted(BOOK.rglob("*.md"))
    summary = BOOK / "SUMMARY.md"
    listed = {
        (BOOK / target).resolve()
        for target in LINK.findall(summary.read_text(encoding="utf-8"))
    }
    for page in pages:
        if page != summary and page.resolve() not in listed:
            problems.append(f"{page.relative_to(ROOT)}: not listed in docs/src/SUMMARY.md")
        problems.extend(check(page))
    for name in REPO_PAGES:
        if (ROOT / name).is_file():
            problems.extend(check(ROOT / name))
    if "--html" in sys.argv[1:]:
        site = Path(sys.argv[sys.argv.index("--html") + 1])
        if not (site / "index.html").is_file():
            problems.append(f"{site}: no built book here (run `mdbook build docs` first)")
        else:
            problems.extend(check_html(site))
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} broken link(s)", file=sys.stderr)
        return 1
    print(f"links: {len(pages)} book pages and {len(REPO_PAGES)} repository pages checked", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
