//! `dispatcher`: see `dispatcher --help` and README.md.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match dispatcher::cli::Config::parse(&args) {
        Ok(Some(c)) => c,
        Ok(None) => {
            println!("{}", dispatcher::cli::USAGE);
            return;
        }
        Err(e) => {
            eprintln!("dispatcher: {e}\n(dispatcher --help for the options)");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dispatcher: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    match rt.block_on(dispatcher::cli::run(cfg)) {
        Ok(summary) => println!("{}", summary.json()),
        Err(e) => {
            eprintln!("dispatcher: {e}");
            std::process::exit(1);
        }
    }
}
