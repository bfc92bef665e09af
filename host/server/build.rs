//! Compiles the gRPC service (`proto/grpc_service.proto`, which imports the model config schema
//! from `../core/proto`) with protox + tonic-prost-build: no system `protoc` needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/grpc_service.proto");
    println!("cargo:rerun-if-changed=../core/proto/model_config.proto");
    let fds = protox::compile(["grpc_service.proto"], ["proto", "../core/proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .build_transport(false)
        // prost's codec, with infer requests charged to the budget before they are decoded
        .codec_path("crate::grpc::codec::BudgetCodec")
        // tensor payloads as `Bytes`: slicing, no copies
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .compile_fds(fds)?;
    Ok(())
}
