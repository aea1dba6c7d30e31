//! `epp-config`: validates an `EndpointPickerConfig` written in YAML (as in the reference's
//! docs) or JSON with the filter's own validator, and prints it as the JSON the Envoy Wasm
//! filter takes in its `configuration`.
//!
//! ```text
//! epp-config FILE            # validate, print compact JSON on stdout
//! epp-config --pretty FILE   # same, indented
//! epp-config --check FILE    # validate only
//! ```
//! `FILE` may be `-` for stdin. An invalid file exits 1 with the field path and reason.

use std::io::Read;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: epp-config [--check|--pretty] FILE|-");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut check = false;
    let mut pretty = false;
    let mut file = None;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" => check = true,
            "--pretty" => pretty = true,
            "-h" | "--help" => {
                println!("usage: epp-config [--check|--pretty] FILE|-\nValidates an EndpointPickerConfig (YAML or JSON) and prints it as JSON.");
                return ExitCode::SUCCESS;
            }
            _ if file.is_none() => file = Some(arg),
            _ => return usage(),
        }
    }
    let Some(file) = file else { return usage() };
    let mut text = String::new();
    let read = if file == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(&file).map(|t| text = t)
    };
    if let Err(e) = read {
        eprintln!("epp-config: cannot read {file}: {e}");
        return ExitCode::from(1);
    }
    let doc: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Object(serde_json::Map::new())
    } else {
        match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(_) => match serde_yaml::from_str(&text) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("epp-config: {file} is neither JSON nor YAML: {e}");
                    return ExitCode::from(1);
                }
            },
        }
    };
    if let Err(e) = epp_filter::runtime::from_value(&doc) {
        eprintln!("epp-config: {file}: {e}");
        return ExitCode::from(1);
    }
    if !check {
        let out = if pretty {
            serde_json::to_string_pretty(&doc)
        } else {
            serde_json::to_string(&doc)
        };
        match out {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("epp-config: {e}");
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}
