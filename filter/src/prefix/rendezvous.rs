//! The rendezvous prior: where a prefix goes when this gateway has not seen it yet.
//!
//! Every gateway replica learns its own prefix index from its own picks, so a prefix group
//! whose requests arrive at R replicas would otherwise be cached on up to R servers. The
//! prior lets replicas agree without talking: the *owner* of a prompt is the candidate with
//! the highest `xxh64(address, seed = key)` (rendezvous, or highest-random-weight,
//! hashing), where the key is the chained hash of the prompt's first `blocks` blocks (or of
//! the whole prompt when it is shorter). It depends only on the prompt and the candidate
//! set, so every replica computes the same owner, and when an endpoint leaves only the
//! prompts it owned move.
//!
//! The prior applies only while the request is *cold for this gateway*: no candidate holds
//! the key's blocks in the learned index. Then the prefix scorer and the affinity filter
//! read the owner as if it held the whole prompt (`Cycle::prefix_affinity`); what reads
//! cached tokens (the P/D decider, the latency predictor, the hit-ratio metric) still reads
//! the learned index. Once this gateway has routed the prefix anywhere, the learned index
//! decides as before. Load bounds it like any prefix match: the saturation filter leaves
//! out an owner that is saturated, and the load scorers still count. With
//! `rendezvousPriorChoices: 2` the second owner is taken to hold half the prompt, so every
//! gateway falls back to the same server when the first is left out.
//!
//! Load weights (`rendezvousPriorLoadWeights`, on by default; BENCHMARKS.md §10): plain
//! rendezvous gives
//! every server chance's share of the groups, the busiest of 16 up to twice the mean.
//! The scraper publishes with each endpoint's snapshot a weight that falls slowly while
//! the server's average load stays above the pool's mean
//! (`crate::datalayer::prior_weights`), and the owner is then the highest
//! `w / -ln(h)` ([`weighted_owners`]): a lighter server owns proportionally fewer
//! groups, only groups it owned move, and each to the server that would own it without
//! it. Every replica scrapes the same servers, so they read the same weights.
//!
//! A group the weights move is warm on its old owner in the learned index of every
//! replica that routed it there, and those replicas would keep following their index
//! while the others follow the weights, so the group would sit on two servers. So while
//! a key's weighted owner `W` differs from its plain owner `U` and this gateway holds
//! the key only on `U` (or on `U` and `W`), the prior still applies: `W` reads as
//! holding the whole prompt and `U` at most half of it ([`promote`]), and every replica
//! follows the move as soon as it reads the weights. A key spread to other servers is
//! left to the learned index.

use super::index::PrefixMatch;
use xxhash_rust::xxh64::xxh64;

/// The full weight of an endpoint ([`weighted_owners`]); weights are in 1/`FULL_WEIGHT`
/// of it, and 0 (none published) reads as full.
pub const FULL_WEIGHT: u16 = 1024;

/// The owner of `key` among `addresses`: the index with the highest rendezvous weight
/// (ties, which need a 64-bit collision, go to the first). `None` without addresses.
pub fn owner<'a>(key: u64, addresses: impl IntoIterator<Item = &'a str>) -> Option<usize> {
    owners::<1>(key, addresses)[0]
}

/// The `N` highest-weight owners of `key`, best first (`None` past the addresses).
pub fn owners<'a, const N: usize>(
    key: u64,
    addresses: impl IntoIterator<Item = &'a str>,
) -> [Option<usize>; N] {
    top(addresses.into_iter().map(|a| xxh64(a.as_bytes(), key)))
}

/// [`owners`] with a weight per endpoint (`(address, weight)`, the weight in
/// 1/[`FULL_WEIGHT`], 0 read as full): endpoint `i` scores `w_i / -ln(h_i)`, `h_i` its
/// hash mapped into (0, 1), so it owns a share of the keys proportional to its weight,
/// and lowering one endpoint's weight moves only keys it owned, each to the endpoint
/// that would own it without it. With every weight full, exactly [`owners`] (and no
/// logarithm computed).
pub fn weighted_owners<'a, const N: usize, I>(key: u64, endpoints: I) -> [Option<usize>; N]
where
    I: IntoIterator<Item = (&'a str, u16)>,
    I::IntoIter: Clone,
{
    let endpoints = endpoints.into_iter();
    if endpoints.clone().all(|(_, w)| full(w)) {
        return owners(key, endpoints.map(|(a, _)| a));
    }
    top(endpoints.map(|(a, w)| weighted_score(xxh64(a.as_bytes(), key), w)))
}

/// Whether a published weight reads as full (0: none published).
fn full(w: u16) -> bool {
    w == 0 || w >= FULL_WEIGHT
}

/// The weighted rendezvous score `w / -ln(h)` of an endpoint whose hash for the key is
/// `hash` (its top 53 bits as a float strictly inside (0, 1)) and whose weight is `w`.
fn weighted_score(hash: u64, w: u16) -> f64 {
    let w = if full(w) { FULL_WEIGHT } else { w };
    let h = ((hash >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    f64::from(w) / -h.ln()
}

/// The indices of the `N` highest `scores`, best first (ties to the first).
fn top<T: PartialOrd + Copy, const N: usize>(
    scores: impl Iterator<Item = T>,
) -> [Option<usize>; N] {
    let mut best: [Option<(usize, T)>; N] = [None; N];
    for (i, w) in scores.enumerate() {
        let mut cur = Some((i, w));
        // Insert into the sorted top N, shifting the lighter ones down.
        for slot in best.iter_mut() {
            let Some((_, w)) = cur else { break };
            match *slot {
                Some((_, b)) if b >= w => {}
                _ => cur = std::mem::replace(slot, cur),
            }
        }
    }
    best.map(|b| b.map(|(i, _)| i))
}

/// The rendezvous key of a prompt: the chained hash of its first `blocks` blocks (all of
/// them when fewer). `None` when `blocks` is 0 (no prior) or there are no hashes.
pub fn key(blocks: usize, hashes: &[u64]) -> Option<u64> {
    let depth = blocks.min(hashes.len());
    depth.checked_sub(1).and_then(|d| hashes.get(d)).copied()
}

/// Most owners the prior may promote (`rendezvousPriorChoices`).
pub const MAX_CHOICES: usize = 4;

/// The prior for one request, given the learned `matches` (one per candidate, in the
/// order of `addresses`): the candidates whose prefix affinity it sets, each with the
/// blocks it reads as holding (`Cycle::prefix_affinity`). `endpoints` are the
/// candidates' addresses with their weights ([`weighted_owners`]).
///
/// * **Cold** (no candidate holds the first `blocks` blocks of `hashes`, all of them
///   when fewer): the `choices` highest-weight owners of that prefix, best first, the
///   first taken to hold the whole prompt and each next rank half as much (the first
///   owner wins unless clearly more loaded, and every gateway falls back to the same
///   second owner).
/// * **Moved** (load weights below full moved the key from its plain owner `U` to
///   another weighted owner `W`, and this gateway holds the key only on `U`, or on `U`
///   and `W`): `W` reads as holding the whole prompt and `U` at most half of it, so
///   every replica follows the move as soon as its weights change, whatever it has
///   routed before, instead of the warm replicas staying on `U` while the cold ones go
///   to `W` (the group split on two servers). A key spread anywhere else is left to the
///   learned index.
///
/// Empty when the prior does not apply (`blocks = 0`, `choices = 0`, no hashes, or a
/// candidate holds the key's blocks and it did not move).
pub fn promote<'a, I>(
    blocks: usize,
    choices: usize,
    hashes: &[u64],
    matches: &[PrefixMatch],
    endpoints: I,
) -> Vec<(usize, u32)>
where
    I: IntoIterator<Item = (&'a str, u16)>,
    I::IntoIter: Clone,
{
    let depth = blocks.min(hashes.len());
    let Some(key) = key(blocks, hashes) else {
        return Vec::new();
    };
    let depth = u32::try_from(depth).unwrap_or(u32::MAX);
    if choices == 0 {
        return Vec::new();
    }
    let total = u32::try_from(hashes.len()).unwrap_or(u32::MAX);
    let learned = |i: usize| matches.get(i).map_or(0, |m| m.matched);
    let mut holders = (0..matches.len()).filter(|&i| learned(i) >= depth);
    match (holders.next(), holders.next(), holders.next()) {
        (None, _, _) => weighted_owners::<MAX_CHOICES, _>(key, endpoints)
            .into_iter()
            .take(choices)
            .flatten()
            .zip(0u32..)
            .map(|(i, rank)| (i, (total >> rank).max(learned(i))))
            .collect(),
        (Some(a), b, None) => moved(key, a, b, endpoints)
            .map(|(w, u)| vec![(w, total), (u, learned(u).min(total >> 1))])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The key's (weighted owner `W`, plain owner `U`) when its weights moved it (`W ≠ U`)
/// and its holders in the learned index, `a` and maybe `b`, are `U` and at most `W`.
fn moved<'a, I>(key: u64, a: usize, b: Option<usize>, endpoints: I) -> Option<(usize, usize)>
where
    I: IntoIterator<Item = (&'a str, u16)>,
    I::IntoIter: Clone,
{
    let endpoints = endpoints.into_iter();
    if endpoints.clone().all(|(_, w)| full(w)) {
        return None;
    }
    // Both owners from one hash per candidate (ties to the first, as in `top`).
    let (mut plain, mut weighted) = (None::<(usize, u64)>, None::<(usize, f64)>);
    for (i, (address, weight)) in endpoints.enumerate() {
        let h = xxh64(address.as_bytes(), key);
        if plain.is_none_or(|(_, best)| h > best) {
            plain = Some((i, h));
        }
        let score = weighted_score(h, weight);
        if weighted.is_none_or(|(_, best)| score > best) {
            weighted = Some((i, score));
        }
    }
    let (w, u) = (weighted?.0, plain?.0);
    let other = if a == u {
        b
    } else if b == Some(u) {
        Some(a)
    } else {
        return None;
    };
    (w != u && other.is_none_or(|o| o == w)).then_some((w, u))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn addrs(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{}:8000", i + 1)).collect()
    }

    fn cold(n: usize, total: u32) -> Vec<PrefixMatch> {
        vec![
            PrefixMatch {
                matched: 0,
                total,
                block_size_tokens: 16
            };
            n
        ]
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn owners_spread_evenly_and_only_the_removed_endpoints_keys_move() {
        let a = addrs(16);
        let owners: Vec<usize> = (0..16_000u64)
            .map(|k| {
                owner(
                    k.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    a.iter().map(String::as_str),
                )
            })
            .map(|o| o.unwrap_or(usize::MAX))
            .collect();
        let mut per = [0usize; 16];
        for &o in &owners {
            per[o] += 1;
        }
        assert!(
            per.iter().all(|&n| (800..1200).contains(&n)),
            "about 1,000 keys each: {per:?}"
        );
        // Without endpoint 5, its keys move elsewhere and no other key moves.
        let fewer: Vec<&str> = a
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 5)
            .map(|(_, s)| s.as_str())
            .collect();
        for (k, &before) in owners.iter().enumerate() {
            let key = (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let after =
                owner(key, fewer.iter().copied()).map(|o| a.iter().position(|s| s == fewer[o]));
            if before != 5 {
                assert_eq!(after, Some(Some(before)), "key {k} moved");
            }
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_lighter_endpoint_owns_fewer_keys_and_only_its_keys_move_to_their_second_owner() {
        let a = addrs(8);
        let keys = (0..16_000u64).map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let weights = |light: u16| {
            let a = &a;
            move || {
                a.iter()
                    .enumerate()
                    .map(move |(i, s)| (s.as_str(), if i == 3 { light } else { 0 }))
            }
        };
        let (full, quarter) = (weights(FULL_WEIGHT), weights(FULL_WEIGHT / 4));
        let (mut owned, mut kept) = (0, 0);
        for key in keys {
            let plain = owners::<2>(key, a.iter().map(String::as_str));
            assert_eq!(weighted_owners::<2, _>(key, full()), plain, "full weights");
            let [first] = weighted_owners::<1, _>(key, quarter());
            if plain[0] == Some(3) {
                owned += 1;
                kept += usize::from(first == Some(3));
                assert!(first == Some(3) || first == plain[1], "key {key}");
            } else {
                assert_eq!(first, plain[0], "key {key} of another endpoint moved");
            }
        }
        // A quarter of the weight of 7 others at full: a share of 0.25 / 7.25 of the
        // keys, 28 % of those it owned at full weight.
        let share = kept as f64 / owned as f64;
        assert!((0.24..0.32).contains(&share), "kept {kept} of {owned}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_owner_does_not_depend_on_the_candidates_order() {
        let a = addrs(8);
        let mut rev = a.clone();
        rev.reverse();
        for key in [1u64, 42, 7_777, u64::MAX] {
            let x = owner(key, a.iter().map(String::as_str)).map(|i| a[i].clone());
            let y = owner(key, rev.iter().map(String::as_str)).map(|i| rev[i].clone());
            assert_eq!(x, y);
        }
    }

    fn promote_in(
        a: &[String],
        blocks: usize,
        choices: usize,
        hashes: &[u64],
        m: &[PrefixMatch],
    ) -> Vec<(usize, u32)> {
        let full = a.iter().map(|s| (s.as_str(), FULL_WEIGHT));
        promote(blocks, choices, hashes, m, full)
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_cold_prompt_goes_to_the_owner_of_its_leading_blocks() {
        let a = addrs(8);
        let hashes = [11u64, 22, 33, 44, 55];
        let want = owner(33, a.iter().map(String::as_str)).unwrap_or(usize::MAX);
        assert_eq!(
            promote_in(&a, 3, 1, &hashes, &cold(8, 5)),
            vec![(want, 5)],
            "the owner is taken to hold the whole prompt"
        );
        // Another prompt with the same first three blocks has the same owner.
        let other = [11u64, 22, 33, 99, 98, 97];
        assert_eq!(promote_in(&a, 3, 1, &other, &cold(8, 6)), vec![(want, 6)]);
        // A prompt shorter than the key's depth is keyed by all of its blocks.
        let short = owner(22, a.iter().map(String::as_str)).unwrap_or(usize::MAX);
        assert_eq!(
            promote_in(&a, 3, 1, &hashes[..2], &cold(8, 2)),
            vec![(short, 2)]
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn choices_promote_the_highest_weights_half_as_much_per_rank() {
        let a = addrs(16);
        for key in 0..200u64 {
            let mut w: Vec<(u64, usize)> = a
                .iter()
                .enumerate()
                .map(|(i, s)| (xxh64(s.as_bytes(), key), i))
                .collect();
            w.sort_unstable_by(|x, y| y.cmp(x));
            let top = owners::<MAX_CHOICES>(key, a.iter().map(String::as_str));
            let want: Vec<Option<usize>> = w.iter().take(MAX_CHOICES).map(|x| Some(x.1)).collect();
            assert_eq!(top.to_vec(), want, "key {key}");
            let got = promote_in(&a, 8, 2, &[7, key], &cold(16, 2));
            assert_eq!(got, vec![(w[0].1, 2), (w[1].1, 1)], "half as much per rank");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_group_the_weights_moved_goes_to_its_new_owner_even_where_it_was_routed_before() {
        let a = addrs(16);
        let hashes = [5u64, 6, 7, 8];
        let key = 7; // three blocks deep
        let [Some(u)] = owners::<1>(key, a.iter().map(String::as_str)) else {
            panic!("no owner")
        };
        let weights = |light: u16| {
            let a = &a;
            move || {
                a.iter()
                    .enumerate()
                    .map(move |(i, s)| (s.as_str(), if i == u { light } else { FULL_WEIGHT }))
            }
        };
        let lowered = weights(1); // almost no weight: the key moves
        let [Some(w)] = weighted_owners::<1, _>(key, lowered()) else {
            panic!("no weighted owner")
        };
        assert_ne!(w, u);
        let held = |holders: &[usize]| {
            let mut m = cold(16, 4);
            for &h in holders {
                m[h].matched = 4;
            }
            m
        };
        // This gateway routed the group to its plain owner before the weights moved it:
        // the new owner reads as holding all of it, the old one half.
        let moved = vec![(w, 4), (u, 2)];
        assert_eq!(promote(3, 1, &hashes, &held(&[u]), lowered()), moved);
        // It has since routed it to both: the same, so it keeps following the move.
        assert_eq!(promote(3, 1, &hashes, &held(&[u, w]), lowered()), moved);
        // Full weights, or a group spread to a third server or only on the new owner:
        // the learned index decides.
        let full = weights(FULL_WEIGHT);
        assert!(promote(3, 1, &hashes, &held(&[u]), full()).is_empty());
        let third = (0..16).find(|&i| i != u && i != w).unwrap_or(0);
        assert!(promote(3, 1, &hashes, &held(&[u, third]), lowered()).is_empty());
        assert!(promote(3, 1, &hashes, &held(&[w]), lowered()).is_empty());
        assert!(promote(3, 1, &hashes, &held(&[u, w, third]), lowered()).is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_prefix_this_gateway_has_routed_is_left_to_the_learned_index() {
        let a = addrs(4);
        let hashes = [1u64, 2, 3, 4];
        let mut m = cold(4, 4);
        m[2].matched = 3;
        assert!(promote_in(&a, 3, 1, &hashes, &m).is_empty());
        // Fewer leading blocks than the key's depth: still cold.
        m[2].matched = 2;
        assert_eq!(promote_in(&a, 3, 1, &hashes, &m).len(), 1);
        // Off, or nothing to hash: no prior.
        assert!(promote_in(&a, 0, 1, &hashes, &cold(4, 4)).is_empty());
        assert!(promote_in(&a, 3, 0, &hashes, &cold(4, 4)).is_empty());
        assert!(promote_in(&a, 3, 1, &[], &cold(4, 0)).is_empty());
    }
}
