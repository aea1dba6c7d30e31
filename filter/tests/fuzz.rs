//! A deterministic, stable-Rust mutation fuzzer over every parser that reads outside
//! input: request bodies (every API), the configuration (JSON, and the YAML path of
//! `epp-config`), the Prometheus text of scrapes, Envoy's admin `/clusters` JSON, the
//! header-map encoding and classification, the SSE model-name restore and the model
//! rewrite of a body, and the shared-data records (a corrupt or truncated record is read
//! and then used by the very operations the VMs run on it).
//!
//! Each target starts from its checked-in corpus (`filter/fuzz/corpus/<target>/`) and
//! applies seeded mutations (bit flips, random bytes, insertions and deletions,
//! duplicated ranges, splices with another seed, dictionary tokens). A panic is a
//! finding: the input is written to `target/fuzz-crashes/<target>-<hash>.bin` and the
//! test fails naming it. Everything is a function of the seed.
//!
//! Budget: `FUZZ_ITERS` executions per target (default 300: the short run of
//! `cargo test` / `scripts/test`), or `FUZZ_SECONDS` per target (`scripts/fuzz`);
//! `FUZZ_SEED` (default 1); `FUZZ_TARGET` runs one target.

#![cfg(not(target_arch = "wasm32"))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use epp_filter::classify::classify;
use epp_filter::config::{Classification, PassiveHealth};
use epp_filter::datalayer::discovery::{parse_clusters, Discovered, DISCOVERED_KEY};
use epp_filter::datalayer::lease::{holder, try_acquire, Lease, LEASE_KEY};
use epp_filter::datalayer::prometheus;
use epp_filter::datalayer::snapshot::{decode_version, Snapshots};
use epp_filter::datalayer::Members;
use epp_filter::endpoint::Candidate;
use epp_filter::endpoint::Endpoint;
use epp_filter::flow_control::config::FlowControlConfig;
use epp_filter::flow_control::state::{FlowRef, FlowState, Head, STATE_KEY};
use epp_filter::headers::HeaderMap;
use epp_filter::health::Outcome;
use epp_filter::inflight::{self, LEDGER_KEY};
use epp_filter::model_rewrite;
use epp_filter::openai::{parse_request, Api};
use epp_filter::prefix::index::PrefixIndex;
use epp_filter::prefix::shared::{slot_key, sync, Cursor, HEAD_KEY};
use epp_filter::rng::Rng;
use epp_filter::routing::{self, Pick};
use epp_filter::scheduler::Request;
use epp_filter::shared_store::{read, update, MemoryStore, SharedStore};
use prost::Message;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A fuzz target: a name (its corpus directory), tokens worth inserting, and the code
/// run on each input.
struct Target {
    name: &'static str,
    dictionary: &'static [&'static str],
    run: fn(&[u8]),
    /// Half the inputs are mutated as JSON values (a node replaced, removed or
    /// duplicated), so they pass the JSON parser and reach the validation behind it.
    json: bool,
}

const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "null",
    "true",
    "-1",
    "1e400",
    "18446744073709551616",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "[[[[[[[[[[[[[[[[",
    "{\"a\":",
    "\"model\":",
    "\"prompt\":",
    "\"messages\":",
    "\"content\":",
    "\"type\":\"text\"",
    "\"tool_calls\":",
    "\"input\":",
    "\"stream\":true",
    "\"cache_salt\":",
];

const TARGETS: &[Target] = &[
    Target {
        name: "request_body",
        dictionary: JSON_TOKENS,
        run: |input| {
            for path in [
                "/v1/completions",
                "/v1/chat/completions",
                "/v1/responses",
                "/v1/embeddings",
                "/v1/rerank",
                "/score",
                "/pooling",
                "/classify",
                "/tokenize",
                "/detokenize",
                "/v1/conversations",
                "/v1/audio/transcriptions",
                "/v1/messages",
                "/v1/messages/count_tokens",
                "/inference/v1/generate",
                "/generate",
                "/v1/chat/completions/render",
                "/anything/else",
            ] {
                let _ = parse_request(Api::from_path(path), input);
            }
        },
        json: true,
    },
    Target {
        name: "config_json",
        dictionary: &[
            "\"plugins\":",
            "\"type\":",
            "\"parameters\":",
            "\"schedulingProfiles\":",
            "\"pluginRef\":",
            "\"weight\":",
            "\"flowControl\":",
            "\"featureGates\":",
            "\"pool\":",
            "\"classification\":",
            "\"passiveHealth\":",
            "\"from\":\"metadata\"",
            "\"1Gi\"",
            "\"10ms\"",
            "\"-5s\"",
            "1e308",
            "-0",
        ],
        run: |input| {
            let _ = epp_filter::runtime::load(&String::from_utf8_lossy(input));
        },
        json: true,
    },
    Target {
        name: "config_yaml",
        dictionary: &[
            "\n",
            "  ",
            "- ",
            ": ",
            "plugins:",
            "type: ",
            "parameters:",
            "pool:",
            "&a ",
            "*a",
            "!!binary ",
            "? ",
            "{",
            "[",
            "~",
            "1k",
            "1Gi",
        ],
        run: |input| {
            // What `epp-config` does with a YAML file.
            if let Ok(v) =
                serde_yaml::from_str::<serde_json::Value>(&String::from_utf8_lossy(input))
            {
                let _ = epp_filter::runtime::from_value(&v);
            }
        },
        json: false,
    },
    Target {
        name: "prometheus",
        dictionary: &[
            "\n",
            "# TYPE ",
            "# HELP ",
            "{",
            "}",
            "=\"",
            "\",",
            " ",
            "NaN",
            "+Inf",
            "-Inf",
            "1e999",
            "vllm:",
            "_bucket{le=\"",
            "\\\"",
            "\\n",
        ],
        run: |input| {
            let parsed = prometheus::parse(&String::from_utf8_lossy(input));
            let _ = format!("{parsed:?}");
        },
        json: false,
    },
    Target {
        name: "admin_clusters",
        dictionary: JSON_TOKENS,
        run: |input| {
            let _ = parse_clusters(input, "pool");
        },
        json: true,
    },
    Target {
        name: "headers",
        dictionary: &[
            "\0",
            "\u{0}\u{0}\u{0}\u{0}",
            "\u{ff}\u{ff}\u{ff}\u{ff}",
            "x-gateway-inference-objective",
        ],
        run: |input| {
            let h = HeaderMap::decode(input);
            let _ = classify(&Classification::default(), &h, &mut |_| None);
            let _ = h.gateway_owned().count();
        },
        json: false,
    },
    Target {
        name: "sse_restore",
        dictionary: &[
            "data: ",
            "\n\n",
            "\"model\":\"",
            "\"model\": \"",
            "sent-model",
            "\"",
            "\\\"",
            "[DONE]",
            "\u{e9}",
        ],
        run: |input| {
            // A response body in chunks split where the input says (a model name may
            // straddle two chunks).
            for sent in ["sent-model", "s"] {
                let mut restorer = model_rewrite::Restorer::new(sent, "client-model");
                let step = 1 + usize::from(input.first().copied().unwrap_or(0) % 31);
                let chunks: Vec<&[u8]> = input.chunks(step).collect();
                for (i, chunk) in chunks.iter().enumerate() {
                    let _ = restorer.chunk(chunk, i + 1 == chunks.len());
                }
            }
            let _ = model_rewrite::rewrite_body(input, "target-model");
        },
        json: false,
    },
    Target {
        name: "shared_records",
        dictionary: &[
            "\u{8}",
            "\u{10}",
            "\u{12}",
            "\u{1a}",
            "\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{1}",
        ],
        run: shared_records,
        json: false,
    },
];

/// The first byte picks the record, the rest is its stored value; then every operation
/// the VMs run on that record. Each must return (an error at most), never panic, and
/// an update must heal a corrupt record.
fn shared_records(input: &[u8]) {
    let Some((&which, bytes)) = input.split_first() else {
        return;
    };
    let s = MemoryStore::default();
    let now = 10_000;
    match which % 7 {
        0 => {
            s.set(LEDGER_KEY, bytes, 0).unwrap();
            let rt = epp_filter::runtime::load("").unwrap();
            let mut cands: Vec<Candidate> = ["10.0.0.1:8000", "10.0.0.2:8000"]
                .iter()
                .map(|a| Candidate::new(a))
                .collect();
            let pick = Pick {
                request: Request {
                    model: "m",
                    prompt: "p",
                    now_ms: now,
                    ..Request::default()
                },
                tokens: 1,
                vm: 1,
                seed: 1,
                started_ns: 0,
                time_plugins: false,
            };
            let routed = routing::route(
                &s,
                &rt.scheduler,
                &pick,
                &mut cands,
                &mut PrefixIndex::new(),
                &mut Cursor::default(),
                &|| 0,
            );
            assert!(routed.is_ok(), "a pick on a corrupt ledger: {routed:?}");
            let policy = PassiveHealth::default();
            inflight::release(
                &s,
                1,
                "10.0.0.1:8000",
                1,
                now,
                Some((Outcome::Failure, &policy)),
            )
            .unwrap();
            inflight::heartbeat(&s, 2, now + 60_000).unwrap();
        }
        1 => {
            s.set(STATE_KEY, bytes, 0).unwrap();
            let config = FlowControlConfig::default();
            let band = config.band(0);
            let head = Head {
                primary: 1,
                secondary: 2,
                bytes: 10,
                tokens: 3,
            };
            let flow = FlowRef {
                priority: 0,
                fairness_id: "t",
            };
            let now = 10_000u64;
            update(&s, STATE_KEY, |st: &mut FlowState| {
                let _ = st.queued(None);
                let _ = st.in_flight();
                st.heartbeat(1, now);
                let _ = st.admit(1, flow, head, &config, &band, now, &|_| 0.0, &|_| {
                    vec![head]
                });
                let grants = st.dispatch(&config, now, 64, &|_| 0.0);
                let _ = st.take_grants(1, now, 64, &|_, _, _| vec![head]);
                let _ = st.cancel(1, flow, head, now, &|_| Vec::new());
                st.finish(1, 3, now);
                grants.len()
            })
            .unwrap();
        }
        2 => {
            s.set(LEASE_KEY, bytes, 0).unwrap();
            let _ = holder(&s, now);
            let taken = try_acquire(&s, 7, now, 1_000);
            if Lease::decode(bytes).is_err() {
                assert_eq!(taken, Ok(true), "a corrupt lease is taken over");
            }
        }
        3 => {
            // A corrupt snapshot record (or version), read as a picking VM reads it.
            let _ = decode_version(bytes);
            if let Some(snap) = Snapshots::decode(bytes.to_vec()) {
                let eps: Vec<Endpoint> = ["10.0.0.1:8000", "10.0.0.2:8000"]
                    .map(|a| Endpoint {
                        address: a.into(),
                        labels: Default::default(),
                    })
                    .into();
                let mut members = Members::new(&eps, &[], None);
                let mut list = members.candidates(&eps, &[], &snap);
                let _ = members.refresh(&mut list, &snap);
                let _ = members.loads(&snap);
                for e in snap.entries() {
                    let _ = (e.metrics(), snap.get(e.key()));
                }
            }
        }
        4 => {
            s.set(DISCOVERED_KEY, bytes, 0).unwrap();
            let _ = read::<Discovered>(&s, DISCOVERED_KEY);
        }
        5 => {
            // A corrupt prefix log head.
            s.set(HEAD_KEY, bytes, 0).unwrap();
            let _ = sync(&s, 1, &mut PrefixIndex::new(), &mut Cursor::default());
        }
        _ => {
            // A corrupt prefix log slot, announced by a valid head.
            let picked = epp_filter::prefix::shared::Picked {
                hashes: &[1, 2, 3],
                speculative: &[4, 5],
                speculative_until_ms: 100,
            };
            let _ = epp_filter::prefix::shared::publish(&s, 2, "10.0.0.1:8000", picked, 100);
            s.set(&slot_key(0), bytes, 0).unwrap();
            let _ = sync(&s, 1, &mut PrefixIndex::new(), &mut Cursor::default());
        }
    }
}

/// The corpus of `target` (every file of its directory, sorted by name).
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(!seeds.is_empty(), "empty corpus {}", dir.display());
    seeds
}

/// One mutated input: a seed from the corpus with 1 to 8 mutations.
fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], dictionary: &[&str]) -> Vec<u8> {
    let mut data = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(8) {
        let len = data.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = rng.next_u64() as u8;
            }
            2 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                data.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                data.drain(at..at + n);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                let copy = data[at..at + n].to_vec();
                let to = rng.below(len + 1);
                data.splice(to..to, copy);
            }
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            6 if len > 0 => {
                data.truncate(rng.below(len));
            }
            _ if !dictionary.is_empty() => {
                let token = dictionary[rng.below(dictionary.len())].as_bytes();
                let at = rng.below(len + 1);
                data.splice(at..at, token.iter().copied());
            }
            _ => {}
        }
    }
    data.truncate(64 * 1024);
    data
}

/// Values worth putting anywhere in a JSON document.
fn odd_value(rng: &mut Rng) -> serde_json::Value {
    use serde_json::json;
    match rng.below(12) {
        0 => json!(null),
        1 => json!(-1),
        2 => json!(0),
        3 => json!(u64::MAX),
        4 => json!(i64::MIN),
        5 => json!(1e308),
        6 => json!(""),
        7 => json!("x".repeat(1 + rng.below(300))),
        8 => json!([]),
        9 => json!({}),
        10 => json!(true),
        _ => json!("\u{0}\u{ffff}é1Gi-5s"),
    }
}

/// One JSON node of `v` chosen at random (`depth` bounds the walk).
fn mutate_node(rng: &mut Rng, v: &mut serde_json::Value, depth: usize) {
    use serde_json::Value;
    let descend = depth < 12 && rng.below(3) != 0;
    match v {
        Value::Object(o) if !o.is_empty() => {
            let keys: Vec<String> = o.keys().cloned().collect();
            let k = keys[rng.below(keys.len())].clone();
            if descend {
                if let Some(child) = o.get_mut(&k) {
                    return mutate_node(rng, child, depth + 1);
                }
            }
            match rng.below(3) {
                0 => {
                    o.remove(&k);
                }
                1 => {
                    o.insert(format!("{k}{}", rng.below(3)), odd_value(rng));
                }
                _ => {
                    o.insert(k, odd_value(rng));
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            let i = rng.below(a.len());
            if descend {
                return mutate_node(rng, &mut a[i], depth + 1);
            }
            match rng.below(3) {
                0 => {
                    a.remove(i);
                }
                1 => {
                    let copy = a[i].clone();
                    a.push(copy);
                }
                _ => a[i] = odd_value(rng),
            }
        }
        _ => *v = odd_value(rng),
    }
}

/// A seed parsed as JSON with 1 to 4 node mutations (a seed that is not JSON is
/// mutated as bytes).
fn mutate_json(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let seed = &seeds[rng.below(seeds.len())];
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(seed) else {
        return mutate(rng, seeds, &[]);
    };
    for _ in 0..1 + rng.below(4) {
        mutate_node(rng, &mut v, 0);
    }
    serde_json::to_vec(&v).unwrap()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs `target` within the budget; returns the executions, or the path of a crash.
fn fuzz(target: &Target, seed: u64) -> Result<u64, String> {
    let seeds = corpus(target.name);
    let deadline = env_u64("FUZZ_SECONDS").map(|s| Instant::now() + Duration::from_secs(s));
    let iters = env_u64("FUZZ_ITERS").unwrap_or(300);
    let mut rng = Rng::new(seed ^ xxhash(target.name.as_bytes()));
    let mut runs = 0u64;
    // The corpus itself first, then mutations.
    let mut next = seeds.clone().into_iter();
    loop {
        let done = match deadline {
            Some(d) => Instant::now() >= d,
            None => runs >= iters + seeds.len() as u64,
        };
        if done {
            return Ok(runs);
        }
        let input = next.next().unwrap_or_else(|| {
            if target.json && rng.below(2) == 0 {
                mutate_json(&mut rng, &seeds)
            } else {
                mutate(&mut rng, &seeds, target.dictionary)
            }
        });
        runs += 1;
        if catch_unwind(AssertUnwindSafe(|| (target.run)(&input))).is_err() {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-crashes");
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("{}-{:016x}.bin", target.name, xxhash(&input)));
            std::fs::write(&path, &input).unwrap();
            return Err(format!(
                "{}: panicked after {runs} executions; input saved to {}",
                target.name,
                path.display()
            ));
        }
    }
}

fn xxhash(bytes: &[u8]) -> u64 {
    // FNV-1a: stable across builds, enough to name a file and seed a target.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[test]
fn every_parser_survives_mutated_input() {
    let seed = env_u64("FUZZ_SEED").unwrap_or(1);
    let only = std::env::var("FUZZ_TARGET").ok();
    // Keep the panic messages of caught panics out of the output; the finding says enough.
    let quiet = std::env::var("FUZZ_VERBOSE").is_err();
    if quiet {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let mut failures = Vec::new();
    for t in TARGETS
        .iter()
        .filter(|t| only.as_deref().is_none_or(|o| o == t.name))
    {
        let started = Instant::now();
        match fuzz(t, seed) {
            Ok(runs) => println!(
                "fuzz {:<15} {runs:>9} executions in {:>6.1} s, no finding",
                t.name,
                started.elapsed().as_secs_f64()
            ),
            Err(e) => failures.push(e),
        }
    }
    if quiet {
        let _ = std::panic::take_hook();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
