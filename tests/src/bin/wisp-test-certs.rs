//! Writes a throwaway PKI (CA, server and client certificates) into the directory given as the
//! only argument, for the tritonclient TLS conformance tests.

fn main() -> anyhow::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: wisp-test-certs DIR"))?;
    wisp_tests::make_test_certs(std::path::Path::new(&dir))?;
    Ok(())
}
