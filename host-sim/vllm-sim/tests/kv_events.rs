//! KV events over ZMQ in vLLM's wire format: a subscriber sees the blocks a request
//! cached and the blocks a later request evicted; the replay socket re-sends them.

mod common;

use bytes::Bytes;
use common::{start, zero_config, Client};
use rmpv::Value;
use serde_json::json;
use std::time::Duration;
use vllm_sim::kv_events::KvEventsConfig;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const TIMEOUT: Duration = Duration::from_secs(10);

fn events_config() -> KvEventsConfig {
    KvEventsConfig::parse(
        r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:0",
            "replay_endpoint":"tcp://127.0.0.1:0","topic":"kv@test@sim-model"}"#,
    )
    .unwrap()
    .unwrap()
}

/// (seq, [(tag, hashes, tokens)]) of one message.
type Batch = (u64, Vec<(String, Vec<u64>, Vec<u64>)>);

fn decode(seq: &[u8], payload: &[u8]) -> Batch {
    let seq = u64::from_be_bytes(seq.try_into().expect("8-byte seq"));
    let v = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
    let batch = v.as_array().expect("array-like batch");
    let events = batch[1].as_array().expect("events");
    let ints = |v: &Value| -> Vec<u64> {
        v.as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    let out = events
        .iter()
        .map(|e| {
            let e = e.as_array().expect("array-like event");
            let tag = e[0].as_str().expect("tag").to_string();
            let hashes = e.get(1).map(ints).unwrap_or_default();
            let tokens = if tag == "BlockStored" {
                ints(&e[3])
            } else {
                Vec::new()
            };
            (tag, hashes, tokens)
        })
        .collect();
    (seq, out)
}

async fn next_batch(sub: &mut SubSocket) -> Batch {
    let m = tokio::time::timeout(TIMEOUT, sub.recv())
        .await
        .expect("an event batch in time")
        .expect("recv");
    let frames = m.into_vec();
    assert_eq!(frames.len(), 3, "[topic, seq, payload]");
    assert_eq!(&frames[0][..], b"kv@test@sim-model");
    decode(&frames[1], &frames[2])
}

#[tokio::test]
async fn stored_and_evicted_blocks_are_published_and_replayed() {
    let mut config = zero_config();
    config.engine.num_gpu_blocks = 8;
    config.engine.block_size = 16;
    config.kv_events = Some(events_config());
    let server = start(config).await;
    let kv = server.kv_event_addrs()[0].clone();
    assert!(
        !kv.events.ends_with(":0"),
        "the bound port is reported: {}",
        kv.events
    );

    let mut sub = SubSocket::new();
    sub.connect(&kv.events).await.expect("connect SUB");
    sub.subscribe("").await.expect("subscribe");
    // Let the subscription reach the publisher (ZMQ's slow joiner).
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut client = Client::connect(server.addrs()[0]).await;
    // 50 tokens: three full blocks of 16.
    let first = "abcd".repeat(50);
    let (status, _) = client
        .post_json(
            "/v1/completions",
            json!({"model": "sim-model", "prompt": first, "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200);
    let mut received = Vec::new();
    let mut stored: Vec<(u64, Vec<u64>)> = Vec::new();
    while stored.len() < 3 {
        let b = next_batch(&mut sub).await;
        for (tag, hashes, tokens) in &b.1 {
            assert_eq!(tag, "BlockStored");
            stored.push((hashes[0], tokens.clone()));
        }
        received.push(b);
    }
    let ids: Vec<u64> = vllm_sim::tokenizer::encode(&first)
        .into_iter()
        .map(u64::from)
        .collect();
    assert_eq!(stored[0].1, ids[..16], "token ids of the first block");
    assert_eq!(stored[2].1, ids[32..48]);

    // Another prompt needing 7 of the 8 blocks evicts the first prompt's blocks.
    let second = "wxyz".repeat(100);
    let (status, _) = client
        .post_json(
            "/v1/completions",
            json!({"model": "sim-model", "prompt": second, "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200);
    let mut removed = Vec::new();
    while removed.is_empty() {
        let b = next_batch(&mut sub).await;
        for (tag, hashes, _) in &b.1 {
            if tag == "BlockRemoved" {
                removed.extend(hashes.iter().copied());
            }
        }
        received.push(b);
    }
    assert!(
        removed.iter().all(|h| stored.iter().any(|(s, _)| s == h)),
        "evicted blocks are the first prompt's"
    );
    let seqs: Vec<u64> = received.iter().map(|b| b.0).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "no gap");

    // Replay from seq 1: every batch from 1 on, then the end marker.
    let mut dealer = DealerSocket::new();
    dealer
        .connect(kv.replay.as_deref().expect("replay endpoint"))
        .await
        .expect("connect DEALER");
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&1u64.to_be_bytes()),
    ])
    .expect("message");
    dealer.send(request).await.expect("send replay request");
    let mut replayed = Vec::new();
    loop {
        let m = tokio::time::timeout(TIMEOUT, dealer.recv())
            .await
            .expect("a replay frame in time")
            .expect("recv");
        let frames = m.into_vec();
        assert_eq!(frames.len(), 3, "[\"\", seq, payload]");
        if frames[1][..] == [0xff; 8] {
            assert!(frames[2].is_empty());
            break;
        }
        replayed.push(decode(&frames[1], &frames[2]));
    }
    assert!(replayed.len() >= received.len() - 1);
    assert_eq!(replayed[..received.len() - 1], received[1..]);
}

#[tokio::test]
async fn reset_prefix_cache_publishes_all_blocks_cleared() {
    let mut config = zero_config();
    config.kv_events = Some(events_config());
    let server = start(config).await;
    let kv = server.kv_event_addrs()[0].clone();
    let mut sub = SubSocket::new();
    sub.connect(&kv.events).await.expect("connect SUB");
    sub.subscribe("").await.expect("subscribe");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut client = Client::connect(server.addrs()[0]).await;
    let (status, _, _) = client.call("POST", "/reset_prefix_cache", "").await;
    assert_eq!(status, 200);
    let (_, events) = next_batch(&mut sub).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, "AllBlocksCleared");
}
