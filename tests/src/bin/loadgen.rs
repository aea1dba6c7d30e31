//! `loadgen`: see `loadgen --help` and `tests::loadgen`.

use tests::loadgen::args::{self, Command, USAGE};
use tests::loadgen::run;

fn main() {
    let config = match args::parse(std::env::args().skip(1)) {
        Ok(Command::Run(c)) => *c,
        Ok(Command::Help) => {
            print!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    };
    let mut builder = if config.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(config.threads);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadgen: cannot start the tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    let out = config.out.clone();
    let summary = match runtime.block_on(run::run(config)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(1);
        }
    };
    let text = serde_json::to_string_pretty(&summary).unwrap_or_default();
    match out {
        Some(path) => {
            if let Err(e) = std::fs::write(&path, text + "\n") {
                eprintln!("loadgen: cannot write {}: {e}", path.display());
                std::process::exit(1);
            }
        }
        None => println!("{text}"),
    }
    eprintln!(
        "loadgen: {} ok of {} sent, {} req/s, {} output tok/s, latency p50 {} ms, TTFT p50 {} ms",
        summary["requests"]["ok"],
        summary["requests"]["sent"],
        summary["requests_per_s"],
        summary["output_tokens_per_s"],
        summary["latency_ms"]["p50"],
        summary["ttft_ms"]["p50"],
    );
}
