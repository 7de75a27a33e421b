//! `airlock serve` (the daemon, same options as `airlockd`) and `airlock keys` (API keys,
//! without a running daemon): thin wrappers over `airlock_server`.

use std::process::ExitCode;

pub fn serve(args: &airlock_server::ServeArgs) -> anyhow::Result<ExitCode> {
    airlock_server::serve(args)?;
    Ok(ExitCode::SUCCESS)
}

pub fn keys(args: &airlock_server::KeysArgs) -> anyhow::Result<ExitCode> {
    airlock_server::keys_cmd::run(args, &mut std::io::stdout(), &mut std::io::stderr())?;
    Ok(ExitCode::SUCCESS)
}
