//! Compiles `proto/model_config.proto` into a descriptor set with `protox` (pure Rust, no system
//! `protoc`), embedded in the crate for text-format parsing of `config.pbtxt`.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/model_config.proto");
    let fds = protox::compile(["model_config.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("model_config.bin");
    std::fs::write(out, fds.encode_to_vec())?;
    Ok(())
}
