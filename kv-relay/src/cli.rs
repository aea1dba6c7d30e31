//! Command-line flags.

use crate::subscriber::{Liveness, Source};
use std::net::SocketAddr;
use std::time::Duration;

pub const USAGE: &str = "\
kv-relay: follows vLLM KV-cache events (ZMQ) and serves each server's cached blocks over HTTP

USAGE: kv-relay --server SPEC [--server SPEC ...] [FLAGS]

  --server SPEC             one model server: comma-separated key=value pairs
                              endpoint=IP:PORT   the server's HTTP address, as the gateway
                                                 names the endpoint (required)
                              events=tcp://H:P   its --kv-events-config endpoint (required)
                              replay=tcp://H:P   its replay_endpoint (recommended)
                              model=NAME         served model name (required)
                              topic=PREFIX       topic prefix to subscribe to [all]
  --tokenizer DIR           the servers' model directory (tokenizer.json; chat template from
                            chat_template.jinja or tokenizer_config.json): publish text keys
                            the filter computes without a tokenizer (its tokenizer: relay)
                            [token-id keys, for vllm-sim's stand-in tokenizer]
  --chat-template FILE      the Jinja chat template vLLM was given with --chat-template
  --text-block-bytes N      bytes per text key block [64]
  --listen IP:PORT          HTTP address [127.0.0.1:9090]; port 0 = ephemeral (printed)
  --max-blocks-per-server N blocks kept per server [1000000]
  --log-capacity N          changes kept for delta answers [1000000]
  --probe-interval DUR      silence before asking the replay socket [1s]
  --stale-after DUR         silence (no event, no replay answer) before stale [5s]
  --replay-timeout DUR      [2s]
";

#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub sources: Vec<Source>,
    pub max_blocks: usize,
    pub log_capacity: usize,
    pub liveness: Liveness,
    /// `--tokenizer`: the model directory (text keys); `None`: token-id keys.
    pub tokenizer: Option<std::path::PathBuf>,
    pub chat_template: Option<std::path::PathBuf>,
    pub text_block_bytes: usize,
}

pub enum Command {
    Run(Config),
    Help,
}

/// `500ms`, `2s`, `1m`.
pub fn duration(v: &str) -> Result<Duration, String> {
    let (n, unit) = v
        .find(|c: char| !c.is_ascii_digit())
        .map_or((v, "s"), |i| v.split_at(i));
    let n: u64 = n.parse().map_err(|_| format!("bad duration {v:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("bad duration {v:?} (ms, s or m)")),
    }
}

fn source(spec: &str) -> Result<Source, String> {
    let mut s = Source {
        endpoint: String::new(),
        model: String::new(),
        events: String::new(),
        replay: None,
        topic: String::new(),
    };
    for pair in spec.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("--server: {pair:?} is not key=value"))?;
        match k {
            "endpoint" => s.endpoint = v.to_string(),
            "events" => s.events = v.to_string(),
            "replay" => s.replay = Some(v.to_string()),
            "model" => s.model = v.to_string(),
            "topic" => s.topic = v.to_string(),
            _ => return Err(format!("--server: unknown key {k:?}")),
        }
    }
    for (name, v) in [
        ("endpoint", &s.endpoint),
        ("events", &s.events),
        ("model", &s.model),
    ] {
        if v.is_empty() {
            return Err(format!("--server {spec:?}: {name}= is required"));
        }
    }
    Ok(s)
}

pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    let mut c = Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
        sources: Vec::new(),
        max_blocks: 1_000_000,
        log_capacity: 1_000_000,
        liveness: Liveness {
            probe_every: Duration::from_secs(1),
            stale_after: Duration::from_secs(5),
            replay_timeout: Duration::from_secs(2),
        },
        tokenizer: None,
        chat_template: None,
        text_block_bytes: 64,
    };
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--help" || a == "-h" {
            return Ok(Command::Help);
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if a.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let count = |v: String, f: &str| -> Result<usize, String> {
            v.parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{f}: expected a positive integer, got {v:?}"))
        };
        match flag.as_str() {
            "--server" => c.sources.push(source(&value()?)?),
            "--listen" => {
                let v = value()?;
                c.listen = v
                    .parse()
                    .map_err(|_| format!("--listen: bad address {v:?}"))?
            }
            "--max-blocks-per-server" => c.max_blocks = count(value()?, &flag)?,
            "--tokenizer" => c.tokenizer = Some(value()?.into()),
            "--chat-template" => c.chat_template = Some(value()?.into()),
            "--text-block-bytes" => c.text_block_bytes = count(value()?, &flag)?,
            "--log-capacity" => c.log_capacity = count(value()?, &flag)?,
            "--probe-interval" => c.liveness.probe_every = duration(&value()?)?,
            "--stale-after" => c.liveness.stale_after = duration(&value()?)?,
            "--replay-timeout" => c.liveness.replay_timeout = duration(&value()?)?,
            other => return Err(format!("unknown flag {other} (see --help)")),
        }
    }
    if c.sources.is_empty() {
        return Err("at least one --server is required (see --help)".into());
    }
    if c.chat_template.is_some() && c.tokenizer.is_none() {
        return Err("--chat-template needs --tokenizer".into());
    }
    if c.liveness.probe_every.is_zero() {
        return Err("--probe-interval must be > 0".into());
    }
    Ok(Command::Run(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, String> {
        match parse(args.iter().map(|s| s.to_string()))? {
            Command::Run(c) => Ok(c),
            Command::Help => Err("help".into()),
        }
    }

    #[test]
    fn servers_and_errors_naming_the_flag() {
        let c = run(&[
            "--server",
            "endpoint=10.0.0.1:8000,events=tcp://10.0.0.1:5557,replay=tcp://10.0.0.1:5558,model=m",
            "--stale-after=500ms",
        ])
        .unwrap();
        assert_eq!(c.sources[0].endpoint, "10.0.0.1:8000");
        assert_eq!(c.sources[0].replay.as_deref(), Some("tcp://10.0.0.1:5558"));
        assert_eq!(c.liveness.stale_after, Duration::from_millis(500));
        assert!(run(&[]).unwrap_err().contains("--server"));
        assert!(run(&["--server", "endpoint=a,model=m"])
            .unwrap_err()
            .contains("events="));
        assert!(run(&["--server", "endpoint=a,events=b,model=m,colour=red"])
            .unwrap_err()
            .contains("colour"));
        assert!(run(&[
            "--server",
            "endpoint=a,events=b,model=m",
            "--stale-after",
            "soon"
        ])
        .is_err());
    }
}
