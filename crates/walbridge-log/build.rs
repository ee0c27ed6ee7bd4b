//! Compiles `proto/walbridge/log/v1/record.proto` with protox (a protobuf
//! compiler in Rust), so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../../proto";
    let file = "walbridge/log/v1/record.proto";
    println!("cargo:rerun-if-changed={root}/{file}");
    let descriptors = protox::compile([file], [root])?;
    prost_build::Config::new()
        .bytes(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
