//! Header pairs in the ABI's wire format: `u32 n`, `n x (u32 klen, u32 vlen)`, then
//! `key\0value\0` for each pair.

/// Serializes header pairs in the wire format.
pub fn serialize_pairs(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + pairs.len() * 24);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Parses header pairs in the wire format; `None` when malformed.
pub fn deserialize_pairs(b: &[u8]) -> Option<Vec<(String, String)>> {
    if b.is_empty() {
        return Some(Vec::new());
    }
    let word = |i: usize| -> Option<usize> {
        Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize)
    };
    let n = word(0)?;
    let mut sizes = Vec::with_capacity(n);
    for i in 0..n {
        sizes.push((word(4 + i * 8)?, word(8 + i * 8)?));
    }
    let mut at = 4 + n * 8;
    let mut out = Vec::with_capacity(n);
    for (kl, vl) in sizes {
        let k = b.get(at..at + kl)?;
        at += kl + 1;
        let v = b.get(at..at + vl)?;
        at += vl + 1;
        out.push((
            String::from_utf8_lossy(k).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_pairs_round_trip_in_the_wire_format() {
        let pairs = vec![
            (":path".to_string(), "/v1".to_string()),
            ("x".to_string(), String::new()),
        ];
        let b = serialize_pairs(&pairs);
        assert_eq!(&b[..4], &2u32.to_le_bytes());
        assert_eq!(&b[4..8], &5u32.to_le_bytes());
        assert_eq!(deserialize_pairs(&b), Some(pairs));
        assert_eq!(deserialize_pairs(&b[..b.len() - 3]), None);
    }
}
