#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| docket::fuzzing::docket_toml(data));
