//! Feeds arbitrary bytes to the pgoutput decoder, as a sequence of messages
//! (the first byte of each chunk says how long it is), so stream-block
//! state changes are exercised too. The decoder must never panic.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use walbridge_source::pgoutput::Decoder;

fuzz_target!(|data: &[u8]| {
    let mut decoder = Decoder::new();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len).min(tail.len());
        let _ = decoder.decode(Bytes::copy_from_slice(&tail[..n]));
        rest = &tail[n..];
    }
});
