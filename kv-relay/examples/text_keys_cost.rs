//! What text keys cost the relay: `BlockStored` events of real token ids applied to the
//! relay's state with token-id keys and with text keys (each block's token ids turned
//! back into bytes, then 64-byte text blocks chained), per block, and the state's memory.
//!
//! `cargo run --release -p kv-relay --example text_keys_cost -- MODEL_DIR [BLOCKS] [tokens|text]`
//! (one kind only with the third argument)
//!
//! The prompts: English-like text (a fixed pseudo-random word sequence), tokenized by the
//! model's own `tokenizer.json`, cut into 16-token blocks, stored as chains of 64 blocks
//! (one event per chain, as vLLM sends a prefill's blocks), `BLOCKS` blocks in all
//! (default 200,000). Wall-clock time: read it with the machine's load.

use kv_relay::model::Model;
use kv_relay::state::{Relay, TextKeys};
use kv_relay::wire::{Batch, Event};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

const WORDS: &[&str] = &[
    "the",
    "model",
    "server",
    "caches",
    "prefix",
    "of",
    "a",
    "prompt",
    "and",
    "routes",
    "requests",
    "to",
    "where",
    "blocks",
    "are",
    "held",
    "gateway",
    "token",
    "value",
    "key",
    "France",
    "Paris",
    "capital",
    "question",
    "answer",
    "brief",
    "assistant",
    "user",
    "system",
    "2024",
    "function",
    "returns",
    "(",
    ")",
    ",",
    ".",
    "\n",
];

fn text(seed: u64, words: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = String::new();
    for _ in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        out.push(' ');
    }
    out
}

fn batches(tokenizer: &tokenizers::Tokenizer, blocks: usize) -> Vec<Batch> {
    const BS: usize = 16;
    const CHAIN: usize = 64;
    let mut out = Vec::new();
    let mut hash = 1u64;
    let mut seed = 0;
    while out.len() * CHAIN < blocks {
        seed += 1;
        let ids = tokenizer
            .encode(text(seed, 900), false)
            .expect("encodes")
            .get_ids()
            .to_vec();
        let Some(tokens) = ids.get(..BS * CHAIN) else {
            continue;
        };
        let hashes: Vec<u64> = (0..CHAIN as u64).map(|i| hash + i).collect();
        hash += CHAIN as u64;
        out.push(Batch {
            ts: 0.0,
            events: vec![Event::Stored {
                hashes,
                parent: None,
                tokens: tokens.to_vec(),
                block_size: BS as u32,
                lora_name: None,
                medium: None,
            }],
            rank: None,
        });
    }
    out
}

/// Live heap bytes (the system allocator, counted).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .expect("usage: text_keys_cost MODEL_DIR [BLOCKS]");
    let blocks: usize = args.next().map_or(200_000, |b| b.parse().expect("BLOCKS"));
    let only = args.next();
    let dir = std::path::Path::new(&dir);
    let started = Instant::now();
    let model = Model::load(dir, None).expect("loads");
    let loaded = started.elapsed();
    println!(
        "model {}: loaded in {:.0} ms; chat template: {}; completion prefix {:?}",
        dir.display(),
        loaded.as_secs_f64() * 1e3,
        match &model.chat {
            Ok(_) => "shape learnt".to_string(),
            Err(e) => format!("not a shape ({e})"),
        },
        model.completion_prefix
    );
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("loads");
    let input = batches(&tokenizer, blocks);
    let n = input.len() * 64;
    let model = Arc::new(model);
    println!("| keys | ns per block stored | keys published | heap bytes per block |");
    println!("|---|---:|---:|---:|");
    for text in [false, true] {
        if only.as_deref().is_some_and(|o| (o == "text") != text) {
            continue;
        }
        let before = LIVE.load(Ordering::Relaxed);
        let mut relay = Relay::new(1, usize::MAX, 1);
        if text {
            relay = relay.with_text(TextKeys {
                model: model.clone(),
                block: 64,
            });
        }
        let s = relay.add_server("a:1", "m");
        let t = Instant::now();
        for (seq, b) in input.iter().enumerate() {
            relay.apply(s, seq as u64, b);
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!(
            "| {} | {ns:.0} | {} | {} |",
            if text { "text (64 B)" } else { "token ids" },
            relay.held(s),
            (LIVE.load(Ordering::Relaxed).saturating_sub(before)) / n
        );
    }
    println!("{n} blocks of 16 tokens");
}
