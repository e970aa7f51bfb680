//! Arbitrary UTF-8 through `parse`, `validate`, `merge_dependencies` and `render`, with the
//! properties of `crates/snakebox-script/tests/support/fuzz_check.rs` (shared with the stable
//! smoke test).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/snakebox-script/tests/support/fuzz_check.rs"]
mod fuzz_check;

fuzz_target!(|data: &[u8]| {
    if let Ok(input) = std::str::from_utf8(data) {
        fuzz_check::check(input);
    }
});
