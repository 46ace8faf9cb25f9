//! Generates envd's message types (prost) and their ProtoJSON forms (pbjson) from `proto/`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("envd_descriptors.bin");
    let protos = ["proto/process.proto", "proto/filesystem.proto"];
    prost_build::Config::new()
        .file_descriptor_set_path(&descriptors)
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_protos(&protos, &["proto"])?;
    let set = std::fs::read(&descriptors)?;
    pbjson_build::Builder::new().register_descriptors(&set)?.build(&[".process", ".filesystem"])?;
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
