//! Decoding vLLM's KV-event payloads (vLLM `vllm/distributed/kv_events.py`).
//!
//! A PUB message is `[topic, seq (8 B big-endian), payload]`; the payload is a msgpack
//! `KVEventBatch` as `msgspec` encodes `array_like` structs with `omit_defaults`:
//! `[ts, events, data_parallel_rank?]`. Each event is tagged:
//!
//! * array form (`array_like=True, tag=True`): `[tag, field…]` in declaration order,
//!   trailing defaulted fields omitted —
//!   `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//!   medium, lora_name, extra_keys?, group_idx?, …]`, `["BlockRemoved", block_hashes,
//!   medium?, group_idx?]`, `["AllBlocksCleared", …]`;
//! * map form (vLLM PR #42892): `{"type": tag, field: value, …}`.
//!
//! A block hash is an integer (vLLM's 64-bit hashes, possibly negative as int64) or
//! `bytes` (newer `ExternalBlockHash`): the last 8 bytes big-endian, as llm-d does.

use rmpv::Value;

/// One decoded event.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: u32,
        lora_name: Option<String>,
        medium: Option<String>,
    },
    Removed {
        hashes: Vec<u64>,
        medium: Option<String>,
    },
    Cleared,
}

/// One decoded batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub events: Vec<Event>,
    pub rank: Option<u64>,
}

/// Decodes a payload. Unknown event tags are skipped (a newer vLLM may add events);
/// a malformed known event is an error naming what is wrong.
pub fn decode_batch(payload: &[u8]) -> Result<Batch, String> {
    let v = rmpv::decode::read_value(&mut &payload[..]).map_err(|e| format!("msgpack: {e}"))?;
    let fields = v.as_array().ok_or("batch: not an array")?;
    let ts = fields
        .first()
        .and_then(Value::as_f64)
        .ok_or("batch: no ts")?;
    let raw = fields
        .get(1)
        .and_then(Value::as_array)
        .ok_or("batch: no events array")?;
    let rank = fields.get(2).and_then(Value::as_u64);
    let mut events = Vec::with_capacity(raw.len());
    for e in raw {
        if let Some(e) = decode_event(e)? {
            events.push(e);
        }
    }
    Ok(Batch { ts, events, rank })
}

/// The positional field names of each event, after the tag.
const STORED: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
];
const REMOVED: &[&str] = &["block_hashes", "medium"];

/// An event's tag and its fields by name, from either form.
struct Fields<'a> {
    tag: &'a str,
    pairs: Vec<(&'a str, &'a Value)>,
}

impl<'a> Fields<'a> {
    fn of(v: &'a Value) -> Result<Self, String> {
        match v {
            Value::Array(a) => {
                let tag = a.first().and_then(Value::as_str).ok_or("event: no tag")?;
                let names: &[&'static str] = match tag {
                    "BlockStored" => STORED,
                    "BlockRemoved" => REMOVED,
                    _ => &[],
                };
                let pairs = names.iter().copied().zip(a.iter().skip(1)).collect();
                Ok(Fields { tag, pairs })
            }
            Value::Map(m) => {
                let pairs: Vec<(&str, &Value)> = m
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str()?, v)))
                    .collect();
                let tag = pairs
                    .iter()
                    .find(|(k, _)| *k == "type")
                    .and_then(|(_, v)| v.as_str())
                    .ok_or("event: no \"type\"")?;
                Ok(Fields { tag, pairs })
            }
            _ => Err("event: neither array nor map".into()),
        }
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }
}

fn decode_event(v: &Value) -> Result<Option<Event>, String> {
    let f = Fields::of(v)?;
    let get = |name: &str| f.get(name);
    let tag = f.tag;
    let string = |name: &str| get(name).and_then(Value::as_str).map(str::to_string);
    match tag {
        "BlockStored" => {
            let hashes = hash_list(get("block_hashes"))?;
            let parent = match get("parent_block_hash") {
                None | Some(Value::Nil) => None,
                Some(h) => Some(hash(h).ok_or("BlockStored: bad parent_block_hash")?),
            };
            let tokens = get("token_ids")
                .and_then(Value::as_array)
                .ok_or("BlockStored: no token_ids")?
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or("BlockStored: a token id is not a u32")?;
            let block_size = get("block_size")
                .and_then(Value::as_u64)
                .and_then(|b| u32::try_from(b).ok())
                .filter(|b| *b > 0)
                .ok_or("BlockStored: no block_size")?;
            Ok(Some(Event::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                lora_name: string("lora_name"),
                medium: string("medium"),
            }))
        }
        "BlockRemoved" => Ok(Some(Event::Removed {
            hashes: hash_list(get("block_hashes"))?,
            medium: string("medium"),
        })),
        "AllBlocksCleared" => Ok(Some(Event::Cleared)),
        _ => Ok(None),
    }
}

fn hash_list(v: Option<&Value>) -> Result<Vec<u64>, String> {
    v.and_then(Value::as_array)
        .ok_or("no block_hashes")?
        .iter()
        .map(|h| hash(h).ok_or_else(|| "a block hash is neither an integer nor bytes".into()))
        .collect()
}

/// A block hash: an integer (two's complement when negative) or the last 8 bytes of
/// a byte string, big-endian.
pub fn hash(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|x| x as u64)),
        Value::Binary(b) => {
            let tail = &b[b.len().saturating_sub(8)..];
            Some(tail.iter().fold(0u64, |h, &x| (h << 8) | u64::from(x)))
        }
        _ => None,
    }
}

/// The sequence number frame.
pub fn seq(frame: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(frame).ok().map(u64::from_be_bytes)
}

/// The replay end marker (−1).
pub const END_SEQ: u64 = u64::MAX;

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value as V;

    fn encode(v: &V) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    #[test]
    fn array_like_batch_as_vllm_sends_it() {
        // vLLM's current field order, with extra_keys and group_idx present.
        let stored = V::Array(vec![
            V::from("BlockStored"),
            V::Array(vec![V::from(11u64), V::from(-2i64)]),
            V::Nil,
            V::Array((1..=4).map(V::from).collect()),
            V::from(2),
            V::Nil,
            V::from("GPU"),
            V::from("adapter"),
            V::Nil,
            V::from(0),
        ]);
        let removed = V::Array(vec![
            V::from("BlockRemoved"),
            V::Array(vec![V::Binary(vec![9, 0, 0, 0, 0, 0, 0, 0, 0, 7])]),
            V::from("GPU"),
        ]);
        let cleared = V::Array(vec![V::from("AllBlocksCleared")]);
        let future = V::Array(vec![V::from("BlockTransferred"), V::from(1)]);
        let batch = V::Array(vec![
            V::F64(1.5),
            V::Array(vec![stored, removed, cleared, future]),
            V::from(0),
        ]);
        let b = decode_batch(&encode(&batch)).unwrap();
        assert_eq!(b.ts, 1.5);
        assert_eq!(b.rank, Some(0));
        assert_eq!(
            b.events,
            vec![
                Event::Stored {
                    hashes: vec![11, u64::MAX - 1],
                    parent: None,
                    tokens: vec![1, 2, 3, 4],
                    block_size: 2,
                    lora_name: Some("adapter".into()),
                    medium: Some("GPU".into()),
                },
                Event::Removed {
                    hashes: vec![7],
                    medium: Some("GPU".into())
                },
                Event::Cleared,
            ],
            "unknown tags are skipped, bytes hashes use the last 8 bytes"
        );
    }

    #[test]
    fn map_events_and_the_oldest_short_form() {
        let map = V::Map(vec![
            (V::from("type"), V::from("BlockStored")),
            (V::from("block_hashes"), V::Array(vec![V::from(5)])),
            (V::from("parent_block_hash"), V::from(4)),
            (V::from("token_ids"), V::Array(vec![V::from(1), V::from(2)])),
            (V::from("block_size"), V::from(2)),
        ]);
        // vLLM 0.9: BlockRemoved without medium, batch without rank.
        let old = V::Array(vec![V::from("BlockRemoved"), V::Array(vec![V::from(5)])]);
        let batch = V::Array(vec![V::F64(0.0), V::Array(vec![map, old])]);
        let b = decode_batch(&encode(&batch)).unwrap();
        assert_eq!(b.rank, None);
        assert!(matches!(
            &b.events[0],
            Event::Stored {
                parent: Some(4),
                ..
            }
        ));
        assert_eq!(
            b.events[1],
            Event::Removed {
                hashes: vec![5],
                medium: None
            }
        );
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert!(decode_batch(b"").is_err());
        assert!(decode_batch(&encode(&V::from(3))).is_err());
        let bad = V::Array(vec![
            V::F64(0.0),
            V::Array(vec![V::Array(vec![V::from("BlockStored"), V::from("x")])]),
        ]);
        assert!(decode_batch(&encode(&bad)).is_err());
        assert_eq!(seq(&[0, 0, 0, 0, 0, 0, 1, 0]), Some(256));
        assert_eq!(seq(&[1, 2]), None);
        assert_eq!(seq(&[0xff; 8]), Some(END_SEQ));
    }
}
