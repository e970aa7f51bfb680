//! A cheap fuzzer that runs on stable, in `cargo test`: a seed corpus mutated by a small
//! deterministic PRNG, every input checked by `support/fuzz_check.rs` (the same checks as the
//! cargo-fuzz target `fuzz/fuzz_targets/pep723_parse.rs`).
//!
//! `SNAKEBOX_FUZZ_ITERATIONS` (default 20 000, about a second) and `SNAKEBOX_FUZZ_SEED` change the run; the input
//! that fails is printed by the panic message of the check, with the iteration number.

#[path = "support/fuzz_check.rs"]
mod fuzz_check;

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Scripts the mutations start from.
const SEEDS: &[&str] = &[
    "",
    "print('hi')\n",
    "# /// script\n# requires-python = \">=3.11\"\n# dependencies = [\n#   \"requests<3\",\n#   \"rich\",\n# ]\n# ///\n\nimport requests\n",
    "# /// script\r\n# dependencies = [\"rich>=13\"]\r\n# ///\r\nprint(1)\r\n",
    "# /// script\n# dependencies = \"x\"\n# ///\n",
    "# /// script\n# requires-python = 3.11\n# ///\n",
    "# /// script\n# dependencies = [\"numpy>=\", \"requests[\", \"; rm -rf /\", 1]\n# ///\n",
    "# /// script\n# dependencies = [\"a\"]\n# ///\nx = 1\n# /// script\n# dependencies = [\"b\"]\n# ///\n",
    "# /// script\n# dependencies = [\"a\"]\nimport a\n",
    "# /// some-toml\n# embedded-csharp = \"\"\"\n# /// <summary>\n# /// text\n# ///\n# /// </summary>\n# public class MyClass { }\n# \"\"\"\n# ///\n",
    "# /// script\n# dependencies = [\"rich\"]\n#\n# [tool.uv]\n# exclude-newer = \"2024-01-01T00:00:00Z\"\n# [tool.uv.sources]\n# rich = { index = \"x\" }\n# ///\n",
    "def f():\n    return \"\"\"\n    # /// script\n    # dependencies = [\"evil\"]\n    # ///\n    \"\"\"\n",
    "# /// script\n# dependencies = [\"pkg @ https://example.invalid/pkg-1.0.tar.gz\", \"torch==2.4.0+cpu; sys_platform == 'linux'\", \"Foo_Bar[x,y]~=1.2\"]\n# requires-python = \">=3.10, <4\"\n# ///\n",
    "# /// script\n# note = \"\"\"\n# ///\n# /// script\n# ///\n# \"\"\"\n# x = 1.5e3\n# y = nan\n# z = 1979-05-27T07:32:00Z\n# ///\n",
];

/// Fragments inserted by the mutator.
const TOKENS: &[&str] = &[
    "# /// script\n",
    "# ///\n",
    "# ///",
    "#\n",
    "# ",
    "\r\n",
    "\n",
    "\r",
    "\"",
    "'",
    "\"\"\"",
    "'''",
    "[",
    "]",
    "{",
    "}",
    "=",
    ",",
    "dependencies",
    "requires-python",
    "tool",
    "[tool.uv]\n",
    "${HOME}",
    ">=",
    "==",
    "~=",
    "===",
    ".*",
    "@",
    ";",
    " python_version < '3.12'",
    "\u{feff}",
    "é",
    "\u{0}",
    "\t",
    "\\",
    "\\u0000",
    "numpy",
    "1.2.3",
    "nan",
    "inf",
    "-",
    "_",
    ".",
    "https://x.invalid/a",
    "file:///etc/passwd",
    "# /// other\n",
];

/// xorshift64*: small, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }
}

fn mutate(rng: &mut Rng, input: &str) -> String {
    let mut chars: Vec<char> = input.chars().collect();
    for _ in 0..=rng.below(8) {
        let at = rng.below(chars.len() + 1);
        match rng.below(6) {
            0 | 1 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                chars.splice(at..at, token.chars());
            }
            2 => {
                let end = (at + 1 + rng.below(8)).min(chars.len());
                if at < end {
                    chars.drain(at..end);
                }
            }
            3 => {
                // Duplicate a line (or a run of text) somewhere else.
                let text: String = chars.iter().collect();
                let lines: Vec<&str> = text.split_inclusive('\n').collect();
                if !lines.is_empty() {
                    let line = lines[rng.below(lines.len())].to_owned();
                    chars.splice(at..at, line.chars());
                }
            }
            4 => {
                // Splice in part of another seed.
                let other: Vec<char> = SEEDS[rng.below(SEEDS.len())].chars().collect();
                let start = rng.below(other.len());
                let end = (start + rng.below(40)).min(other.len());
                chars.splice(at..at, other[start..end].iter().copied());
            }
            _ => {
                if at < chars.len() {
                    let alphabet = [
                        '#', ' ', '/', '\n', '\r', '"', '=', '[', ']', 'a', '1', '.', '\u{2028}',
                    ];
                    chars[at] = alphabet[rng.below(alphabet.len())];
                }
            }
        }
    }
    chars.into_iter().collect()
}

#[test]
fn seeds_pass_the_checks() {
    for seed in SEEDS {
        fuzz_check::check(seed);
    }
}

#[test]
fn mutated_inputs_pass_the_checks() {
    let iterations: usize = std::env::var("SNAKEBOX_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let seed: u64 = std::env::var("SNAKEBOX_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_5eed_5eed_5eed);
    let mut rng = Rng(seed | 1);
    let mut corpus: Vec<String> = SEEDS.iter().map(|s| (*s).to_owned()).collect();
    for iteration in 0..iterations {
        let parent = corpus[rng.below(corpus.len())].clone();
        let input = mutate(&mut rng, &parent);
        let outcome = catch_unwind(AssertUnwindSafe(|| fuzz_check::check(&input)));
        assert!(
            outcome.is_ok(),
            "iteration {iteration} (seed {seed}) failed on input {input:?}"
        );
        // Keep some mutants as parents, so mutations compound; bounded to stay cheap.
        if corpus.len() < 512 && rng.below(4) == 0 && input.len() < 4096 {
            corpus.push(input);
        }
    }
}
