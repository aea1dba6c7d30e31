//! vLLM's KV-event wire format (vLLM `vllm/distributed/kv_events.py`), encoded.
//!
//! A message on the PUB socket has three frames: the topic, the sequence number
//! (8 bytes, big-endian, from 0, +1 per batch) and the msgpack payload. vLLM encodes
//! with `msgspec` structs declared `array_like=True, omit_defaults=True`:
//!
//! * `KVEventBatch` = `[ts (float, seconds since the epoch), events, data_parallel_rank]`;
//! * each event is tagged (`tag=True`): an array whose first element is the class name;
//!   * `["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size,
//!     lora_id|nil, medium, lora_name|nil]` (trailing defaulted fields — `extra_keys`,
//!     `group_idx`, the hybrid-cache fields — omitted);
//!   * `["BlockRemoved", block_hashes, medium]`;
//!   * `["AllBlocksCleared"]`.
//!
//! Block hashes are sent as unsigned integers (vLLM's 64-bit hashes; newer vLLM may send
//! `bytes`, which consumers also accept). One `BlockStored` per stored block here (vLLM
//! groups a request's consecutive blocks in one event; both are valid).

use crate::engine::kv_cache::KvEvent;

/// vLLM's GPU medium name.
pub const MEDIUM_GPU: &str = "GPU";

/// One batch's payload: `events` (in order) at `ts` seconds, from `rank`.
pub fn encode_batch(ts: f64, events: &[KvEvent], block_size: usize, rank: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 32);
    // Writing to a Vec cannot fail.
    let _ = write_batch(&mut out, ts, events, block_size, rank);
    out
}

fn write_batch(
    out: &mut Vec<u8>,
    ts: f64,
    events: &[KvEvent],
    block_size: usize,
    rank: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use rmp::encode::*;
    write_array_len(out, 3)?;
    write_f64(out, ts)?;
    write_array_len(out, events.len() as u32)?;
    for e in events {
        match e {
            KvEvent::Stored {
                hash,
                parent,
                tokens,
                lora,
            } => {
                write_array_len(out, 8)?;
                write_str(out, "BlockStored")?;
                write_array_len(out, 1)?;
                write_uint(out, *hash)?;
                match parent {
                    Some(p) => write_uint(out, *p).map(|_| ())?,
                    None => write_nil(out)?,
                }
                write_array_len(out, tokens.len() as u32)?;
                for t in tokens {
                    write_uint(out, u64::from(*t))?;
                }
                write_uint(out, block_size as u64)?;
                write_nil(out)?; // lora_id (deprecated)
                write_str(out, MEDIUM_GPU)?;
                match lora {
                    Some(name) => write_str(out, name)?,
                    None => write_nil(out)?,
                }
            }
            KvEvent::Removed { hash } => {
                write_array_len(out, 3)?;
                write_str(out, "BlockRemoved")?;
                write_array_len(out, 1)?;
                write_uint(out, *hash)?;
                write_str(out, MEDIUM_GPU)?;
            }
            KvEvent::Cleared => {
                write_array_len(out, 1)?;
                write_str(out, "AllBlocksCleared")?;
            }
        }
    }
    write_uint(out, rank as u64)?;
    Ok(())
}

/// The sequence-number frame of batch `seq`.
pub fn seq_frame(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// The replay end marker's sequence frame: −1 as a signed 64-bit big-endian integer.
pub const END_SEQ: [u8; 8] = [0xff; 8];

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    #[test]
    fn batch_is_an_array_of_tagged_array_events() {
        let events = vec![
            KvEvent::Stored {
                hash: u64::MAX - 1,
                parent: None,
                tokens: vec![7, 8],
                lora: None,
            },
            KvEvent::Stored {
                hash: 5,
                parent: Some(u64::MAX - 1),
                tokens: vec![9, 10],
                lora: Some("ad".into()),
            },
            KvEvent::Removed { hash: 5 },
            KvEvent::Cleared,
        ];
        let bytes = encode_batch(12.5, &events, 2, 0);
        let v = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let b = v.as_array().unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].as_f64(), Some(12.5));
        assert_eq!(b[2].as_u64(), Some(0), "data_parallel_rank");
        let ev = b[1].as_array().unwrap();
        let stored = ev[0].as_array().unwrap();
        assert_eq!(stored[0].as_str(), Some("BlockStored"));
        assert_eq!(stored[1], Value::Array(vec![Value::from(u64::MAX - 1)]));
        assert!(stored[2].is_nil());
        assert_eq!(
            stored[3],
            Value::Array(vec![Value::from(7), Value::from(8)])
        );
        assert_eq!(stored[4].as_u64(), Some(2));
        assert!(stored[5].is_nil());
        assert_eq!(stored[6].as_str(), Some("GPU"));
        assert!(stored[7].is_nil());
        let child = ev[1].as_array().unwrap();
        assert_eq!(child[2].as_u64(), Some(u64::MAX - 1));
        assert_eq!(child[7].as_str(), Some("ad"));
        let removed = ev[2].as_array().unwrap();
        assert_eq!(removed[0].as_str(), Some("BlockRemoved"));
        assert_eq!(removed[1], Value::Array(vec![Value::from(5)]));
        assert_eq!(ev[3], Value::Array(vec![Value::from("AllBlocksCleared")]));
    }

    #[test]
    fn frames_are_big_endian() {
        assert_eq!(seq_frame(258), [0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(i64::from_be_bytes(END_SEQ), -1);
    }
}
