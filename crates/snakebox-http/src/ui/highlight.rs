//! Python source split into classed tokens for the run page's script (keywords, strings,
//! comments, numbers, builtins, decorators). The template renders each token as an escaped
//! `<span class="…">`, so highlighting adds no HTML of its own and nothing to the CSP: what is
//! shown is exactly the script's text.

/// Python's keywords (soft ones included: `match`, `case`, `type`, `_` are not, as names).
const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Builtins worth telling apart from the script's own names.
const BUILTINS: &[&str] = &[
    "abs",
    "all",
    "any",
    "bool",
    "bytes",
    "dict",
    "enumerate",
    "Exception",
    "filter",
    "float",
    "format",
    "getattr",
    "hasattr",
    "int",
    "isinstance",
    "iter",
    "len",
    "list",
    "map",
    "max",
    "min",
    "next",
    "object",
    "open",
    "print",
    "range",
    "repr",
    "reversed",
    "round",
    "self",
    "set",
    "setattr",
    "sorted",
    "str",
    "sum",
    "super",
    "tuple",
    "type",
    "zip",
];

/// One token: its CSS class (`""` for plain text) and its text.
pub(crate) type Token = (&'static str, String);

/// The end (byte index) of the string literal whose quote starts at `start`.
fn string_end(source: &str, start: usize) -> usize {
    let rest = &source[start..];
    let quote = if rest.starts_with("\"\"\"") {
        "\"\"\""
    } else if rest.starts_with("'''") {
        "'''"
    } else if rest.starts_with('"') {
        "\""
    } else {
        "'"
    };
    let body = start + quote.len();
    let mut chars = source[body..].char_indices();
    while let Some((offset, c)) = chars.next() {
        let at = body + offset;
        if c == '\\' {
            chars.next();
            continue;
        }
        if source[at..].starts_with(quote) {
            return at + quote.len();
        }
        // A one-line string ends at the line's end (unterminated: the lexer goes on).
        if quote.len() == 1 && c == '\n' {
            return at;
        }
    }
    source.len()
}

/// `source` as tokens, in order; their texts joined are `source` exactly.
pub(crate) fn python(source: &str) -> Vec<Token> {
    let mut tokens: Vec<Token> = Vec::new();
    let mut push = |class: &'static str, text: &str| match tokens.last_mut() {
        Some((last, existing)) if *last == class => existing.push_str(text),
        _ => tokens.push((class, text.to_owned())),
    };
    let bytes = source.as_bytes();
    let mut i = 0;
    while i < source.len() {
        let c = source[i..].chars().next().unwrap_or(' ');
        let next = i + c.len_utf8();
        if c == '#' {
            let end = source[i..].find('\n').map_or(source.len(), |n| i + n);
            push("tok-comment", &source[i..end]);
            i = end;
        } else if c == '"' || c == '\'' {
            let end = string_end(source, i);
            push("tok-string", &source[i..end]);
            i = end;
        } else if c.is_ascii_digit() {
            let mut end = next;
            while end < source.len()
                && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'.' || bytes[end] == b'_')
            {
                end += 1;
            }
            push("tok-number", &source[i..end]);
            i = end;
        } else if c == '@' && (i == 0 || source[..i].trim_end_matches([' ', '\t']).ends_with('\n'))
        {
            let end = source[i..].find('\n').map_or(source.len(), |n| i + n);
            push("tok-decorator", &source[i..end]);
            i = end;
        } else if c.is_alphabetic() || c == '_' {
            let mut end = next;
            while end < source.len() {
                let d = source[end..].chars().next().unwrap_or(' ');
                if d.is_alphanumeric() || d == '_' {
                    end += d.len_utf8();
                } else {
                    break;
                }
            }
            let word = &source[i..end];
            // A string prefix (r"…", f'…', rb"…") belongs to its string.
            if word.len() <= 2
                && word.chars().all(|p| "rRbBuUfF".contains(p))
                && source[end..].starts_with(['"', '\''])
            {
                let stop = string_end(source, end);
                push("tok-string", &source[i..stop]);
                i = stop;
                continue;
            }
            let class = if KEYWORDS.contains(&word) {
                "tok-keyword"
            } else if BUILTINS.contains(&word) {
                "tok-builtin"
            } else {
                ""
            };
            push(class, word);
            i = end;
        } else {
            push("", &source[i..next]);
            i = next;
        }
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(source: &str) -> Vec<(&'static str, String)> {
        python(source)
            .into_iter()
            .filter(|(class, _)| !class.is_empty())
            .collect()
    }

    #[test]
    fn tokens_cover_the_source_exactly() {
        for source in [
            "import os\nprint(f\"{x!r}\" + 'a\\'b')  # done\n",
            "s = '''multi\nline'''\n@decorator\ndef f(self): return 0x1F + 1_000.5\n",
            "x = 'unterminated\ny = \"ok\"\nnon_ascii = 'é\\é' # ü\n",
            "'\\",
            "",
        ] {
            let joined: String = python(source).into_iter().map(|(_, text)| text).collect();
            assert_eq!(joined, source);
        }
    }

    #[test]
    fn each_kind_gets_its_class() {
        let found = classes("@cache\ndef f(n):\n    return len(rb'x') + 10  # why\n");
        assert_eq!(
            found,
            [
                ("tok-decorator", "@cache".to_owned()),
                ("tok-keyword", "def".to_owned()),
                ("tok-keyword", "return".to_owned()),
                ("tok-builtin", "len".to_owned()),
                ("tok-string", "rb'x'".to_owned()),
                ("tok-number", "10".to_owned()),
                ("tok-comment", "# why".to_owned()),
            ]
        );
        // The unterminated string ends at its line; the next line is lexed again.
        let found = classes("a = 'open\nif b: pass\n");
        assert_eq!(found[0], ("tok-string", "'open".to_owned()));
        assert_eq!(found[1], ("tok-keyword", "if".to_owned()));
    }
}
