//! Compiles `proto/walbridge/feed/v1/feed.proto` with protox (a protobuf
//! compiler in Rust, so building needs no `protoc`) into the messages, the
//! server and the client, and keeps the encoded descriptors for server
//! reflection.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../../proto";
    let file = "walbridge/feed/v1/feed.proto";
    println!("cargo:rerun-if-changed={root}/{file}");
    let descriptors = protox::compile([file], [root])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("feed_descriptors.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .bytes(".walbridge.feed.v1")
        .compile_fds(descriptors)?;
    Ok(())
}
