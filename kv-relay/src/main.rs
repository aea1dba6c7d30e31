//! `kv-relay`: see `kv-relay --help` and the crate README.

use kv_relay::cli::{self, Command};
use std::io::Write;

fn main() {
    let config = match cli::parse(std::env::args().skip(1)) {
        Ok(Command::Run(c)) => c,
        Ok(Command::Help) => {
            print!("{}", cli::USAGE);
            return;
        }
        Err(e) => {
            eprintln!("kv-relay: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kv-relay: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        let running = match kv_relay::start(config).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("kv-relay: cannot listen: {e}");
                return 1;
            }
        };
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "kv-relay listening on http://{}", running.addr);
            let _ = out.flush();
        }
        let _ = tokio::signal::ctrl_c().await;
        0
    });
    std::process::exit(code);
}
