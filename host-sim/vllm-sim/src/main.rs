//! `vllm-sim`: see `vllm-sim --help` and the crate README.

use std::io::Write;
use vllm_sim::cli::{self, Command};

fn main() {
    let config = match cli::parse(std::env::args().skip(1)) {
        Ok(Command::Run(config)) => config,
        Ok(Command::Help) => {
            print!("{}", cli::USAGE);
            return;
        }
        Err(e) => {
            eprintln!("vllm-sim: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vllm-sim: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        let server = match vllm_sim::server::start(*config).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("vllm-sim: cannot listen: {e}");
                return 1;
            }
        };
        {
            let mut out = std::io::stdout().lock();
            for addr in server.addrs() {
                let _ = writeln!(out, "vllm-sim listening on http://{addr}");
            }
            for kv in server.kv_event_addrs() {
                let _ = writeln!(out, "vllm-sim kv events on {}", kv.events);
                if let Some(replay) = &kv.replay {
                    let _ = writeln!(out, "vllm-sim kv events replay on {replay}");
                }
            }
            let _ = out.flush();
        }
        wait_for_signal().await;
        server.stop();
        0
    });
    std::process::exit(code);
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
