//! Finding `# /// TYPE` … `# ///` blocks in a script, line by line (PEP 723).
//!
//! The PEP gives a canonical regular expression:
//!
//! ```text
//! (?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$
//! ```
//!
//! This module implements the same semantics with a scanner over lines, which is linear, needs no
//! regex engine, and lets every block keep a map from its TOML content back to script lines and
//! columns. "In circumstances where there is a discrepancy between the text specification and
//! the regular expression, the text specification takes precedence", and where this module
//! differs from the regex it follows the text, or this product's needs:
//!
//! - A line may end in `\r\n`: the `\r` is not part of the line (the regex, whose `$` only sees
//!   `\n`, finds no block at all in a CRLF script).
//! - A UTF-8 byte order mark before the first line is ignored, as Python's own reader does.
//! - `# /// script` immediately followed by `# ///` is an empty block: the text asks nothing of
//!   the lines in between, the regex wants at least one.
//! - **Deliberate deviation:** the text says "Unclosed blocks MUST be ignored". An unclosed
//!   `# /// script` is reported here instead (the callers turn it into an error), because the
//!   user of this server is an agent who forgot `# ///`, and ignoring the block would run the
//!   script without its dependencies and fail later with a confusing `ModuleNotFoundError`.
//!   Unclosed blocks of other TYPEs are ignored, as the text says.
//!
//! A block-like text inside a Python string literal is a block when its lines start at column 0
//! with `#`: PEP 723 works on lines, not on Python tokens, and uv reads it the same way. Lines
//! that are indented, or where `#` follows code on the same line, are never blocks.
//!
//! The scanner only reads. The engine runs the user's script exactly as written: a block is never
//! removed from, or rewritten in, the script.

use std::ops::Range;

/// The TYPE of the blocks this crate reads.
pub(crate) const SCRIPT_TYPE: &str = "script";

/// One line of a script, without its line terminator.
#[derive(Debug, Clone, Copy)]
struct Line<'a> {
    /// The text, without `\n` or `\r\n`.
    text: &'a str,
    /// Byte offset of the line's first byte in the script.
    start: usize,
}

impl Line<'_> {
    /// Byte offset just past the line's text (its terminator excluded).
    fn end(&self) -> usize {
        self.start + self.text.len()
    }
}

/// Splits on `\n`, as the regex's `^` and `$` do, and drops a `\r` before it.
fn lines(script: &str) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    let mut start = 0;
    // A byte order mark is not part of the first line (Python's `utf-8-sig` reading drops it).
    if script.starts_with('\u{feff}') {
        start = '\u{feff}'.len_utf8();
    }
    while start <= script.len() {
        let rest = &script[start..];
        let (raw, next) = match rest.find('\n') {
            Some(i) => (&rest[..i], Some(start + i + 1)),
            None => (rest, None),
        };
        let text = raw.strip_suffix('\r').unwrap_or(raw);
        out.push(Line { text, start });
        match next {
            Some(next) => start = next,
            None => break,
        }
    }
    out
}

/// `# /// TYPE` → `Some(TYPE)`.
///
/// > "Any Python script may have top-level comment blocks that MUST start with the line
/// > `# /// TYPE` where TYPE determines how to process the content. That is: a single `#`,
/// > followed by a single space, followed by three forward slashes, followed by a single space,
/// > followed by the type of metadata."
/// >
/// > "The TYPE MUST only consist of ASCII letters, numbers and hyphens."
fn opening_type(line: &str) -> Option<&str> {
    let kind = line.strip_prefix("# /// ")?;
    let valid = !kind.is_empty() && kind.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    valid.then_some(kind)
}

/// > "Every line between these two lines (`# /// TYPE` and `# ///`) MUST be a comment starting
/// > with `#`. If there are characters after the `#` then the first character MUST be a space."
fn is_content(line: &str) -> bool {
    line == "#" || line.starts_with("# ")
}

/// > "Block MUST end with the line `# ///`. That is: a single `#`, followed by a single space,
/// > followed by three forward slashes."
fn is_closing(line: &str) -> bool {
    line == "# ///"
}

/// One line of a block's content, to map TOML positions back to the script.
#[derive(Debug, Clone, Copy)]
struct ContentLine {
    /// Byte offset of this line in the block's content.
    content_start: usize,
    /// 1-based line number in the script.
    script_line: usize,
    /// Characters removed at the start of the script line (`# ` = 2, `#` = 1).
    prefix_chars: usize,
}

/// A complete block found in a script.
#[derive(Debug, Clone)]
pub(crate) struct RawBlock {
    /// Bytes of the script from the opening `#` to the end of the closing `# ///` (terminator
    /// excluded).
    pub(crate) span: Range<usize>,
    /// 1-based line of the opening line.
    pub(crate) opening_line: usize,
    /// The embedded content, one `\n`-terminated line per content line.
    pub(crate) content: String,
    lines: Vec<ContentLine>,
}

impl RawBlock {
    /// 1-based (line, column) in the script of a byte offset in [`RawBlock::content`]; the
    /// column counts characters.
    pub(crate) fn locate(&self, offset: usize) -> (usize, usize) {
        let index = self
            .lines
            .partition_point(|line| line.content_start <= offset)
            .saturating_sub(1);
        let Some(line) = self.lines.get(index) else {
            // No content lines: point at the opening line.
            return (self.opening_line, 1);
        };
        let offset = offset.min(self.content.len());
        let before = self
            .content
            .get(line.content_start..offset)
            .map_or(0, |text| text.chars().count());
        (line.script_line, line.prefix_chars + before + 1)
    }
}

/// What the scanner found in a whole script.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Complete `script` blocks, in order (more than one is an error for the caller to report).
    pub(crate) blocks: Vec<RawBlock>,
    /// 1-based lines of `# /// script` opening lines that are never closed.
    pub(crate) unclosed: Vec<usize>,
}

/// Finds every `script` block of a script (blocks of other TYPEs are skipped, as the PEP lets
/// each tool read only the TYPEs it knows).
pub(crate) fn scan(script: &str) -> Scan {
    let lines = lines(script);
    let mut scan = Scan::default();
    let mut i = 0;
    while i < lines.len() {
        let Some(kind) = opening_type(lines[i].text) else {
            i += 1;
            continue;
        };
        // > "Precedence for an ending line `# ///` is given when the next line is not a valid
        // > embedded content line as described above."
        // So the block ends at the *last* `# ///` of the run of comment lines that follows the
        // opening line (the regex's greedy `(...)+`).
        let mut closing = None;
        let mut j = i + 1;
        while j < lines.len() && is_content(lines[j].text) {
            if is_closing(lines[j].text) {
                closing = Some(j);
            }
            j += 1;
        }
        let Some(closing) = closing else {
            // > "Unclosed blocks MUST be ignored."
            // Not for `script`: see the module documentation (a deliberate deviation).
            if kind == SCRIPT_TYPE {
                scan.unclosed.push(i + 1);
            }
            // Like the regex's `finditer`, try again from the next line.
            i += 1;
            continue;
        };
        // > "Tools MUST NOT read from metadata blocks with types that have not been standardized
        // > by this specification."
        if kind == SCRIPT_TYPE {
            scan.blocks.push(block(&lines, i, closing));
        }
        // Matches do not overlap: an opening line inside this block is content.
        i = closing + 1;
    }
    scan
}

/// Builds the block from its opening line `open` to its closing line `close` (indices).
fn block(lines: &[Line<'_>], open: usize, close: usize) -> RawBlock {
    let mut content = String::new();
    let mut map = Vec::with_capacity(close - open);
    for (index, line) in lines.iter().enumerate().take(close).skip(open + 1) {
        // > "The embedded content is formed by taking away the first two characters of each line
        // > if the second character is a space, otherwise just the first character (which means
        // > the line consists of only a single `#`)."
        let (text, prefix_chars) = match line.text.strip_prefix("# ") {
            Some(text) => (text, 2),
            None => ("", 1),
        };
        map.push(ContentLine {
            content_start: content.len(),
            script_line: index + 1,
            prefix_chars,
        });
        content.push_str(text);
        content.push('\n');
    }
    RawBlock {
        span: lines[open].start..lines[close].end(),
        opening_line: open + 1,
        content,
        lines: map,
    }
}

#[cfg(test)]
mod tests {
    use indoc::indoc;

    use super::*;

    #[test]
    fn locate_maps_content_offsets_to_script_positions() {
        let script = indoc! {r#"
            import os
            # /// script
            # dependencies = [
            #   "requests",
            #
            # ]
            # ///
        "#};
        let scan = scan(script);
        let block = &scan.blocks[0];
        assert_eq!(block.content, "dependencies = [\n  \"requests\",\n\n]\n");
        // `"requests"` starts at content line 2, character 3 → script line 4, column 5.
        let offset = block.content.find('"').unwrap();
        assert_eq!(block.locate(offset), (4, 5));
        // The empty `#` line.
        let offset = block.content.find("\n\n").unwrap() + 1;
        assert_eq!(block.locate(offset), (5, 2));
        assert_eq!(
            &script[block.span.clone()],
            script.trim_start_matches("import os\n").trim_end()
        );
    }

    #[test]
    fn opening_type_follows_the_pep() {
        assert_eq!(opening_type("# /// script"), Some("script"));
        assert_eq!(opening_type("# /// my-tool2"), Some("my-tool2"));
        assert_eq!(opening_type("# /// script "), None);
        assert_eq!(opening_type("# ///"), None);
        assert_eq!(opening_type("#  /// script"), None);
        assert_eq!(opening_type("# /// scr_ipt"), None);
        assert_eq!(opening_type(" # /// script"), None);
    }

    #[test]
    fn lines_handle_crlf_bom_and_no_final_newline() {
        let texts: Vec<_> = lines("\u{feff}a\r\nb\nc").iter().map(|l| l.text).collect();
        assert_eq!(texts, ["a", "b", "c"]);
        let texts: Vec<_> = lines("a\n").iter().map(|l| l.text).collect();
        assert_eq!(texts, ["a", ""]);
    }
}
