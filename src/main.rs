//! Binary entry point: parse flags, run the command, turn errors into exit codes
//! (0 ok, 1 runtime failure, 2 bad usage or config, 3 no usable driver backend).
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    #[cfg(feature = "fake-driver")]
    if let Some(code) = npu_health_agent::fake::run_as_npu_smi() {
        return ExitCode::from(code);
    }
    npu_health_agent::cli::main()
}
