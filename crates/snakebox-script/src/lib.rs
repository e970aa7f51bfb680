//! PEP 723 inline script metadata, and PEP 508 / PEP 440 validation.
//!
//! Pure functions, no I/O: this crate parses a script's `# /// script` block, merges it with
//! dependencies given alongside the script, and renders a block back. It is the first thing
//! that touches untrusted input, so it is fuzzed.
#![deny(missing_docs)]
