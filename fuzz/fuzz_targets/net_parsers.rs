//! Arbitrary bytes through the run proxy's parsers (the TLS ClientHello reader, the proxy
//! request parser, the IP-literal recogniser) with the invariants of
//! `snakebox_sandbox::check_parsers` (shared with the stable unit tests).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    snakebox_sandbox::check_parsers(data);
});
