//! Feeds arbitrary bytes to the backend-message framing and the CopyBoth
//! message parser. Neither may panic.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use walbridge_source::wire::codec::{BackendMessage, decode};
use walbridge_source::wire::copyboth::ServerMessage;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(message)) = decode(&mut buf) {
        if let BackendMessage::CopyData(payload) = message {
            let _ = ServerMessage::parse(payload);
        }
    }
});
