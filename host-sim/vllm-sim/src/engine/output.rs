//! How many tokens a request generates, following llm-d-inference-sim's
//! `random` mode (docs/response_generation.md).

use crate::rng::Rng;

/// Probabilities of the six length buckets used when `max_tokens` is set.
const BUCKET_PROBABILITIES: [f64; 6] = [0.2, 0.3, 0.2, 0.05, 0.1, 0.15];

/// Output length for a request.
///
/// * `ignore_eos` with `max_tokens`: exactly `max_tokens`.
/// * `max_tokens` set: drawn from six buckets over `1..=max_tokens` with
///   probabilities 20/30/20/5/10/15 %; equal-width up to 120 tokens, otherwise
///   buckets 1, 2, 3, 5 and 6 are 20 tokens wide and bucket 4 takes the rest.
/// * no `max_tokens`: Normal(40, 20), within `1..=limit` (uniform if the limit is < 20).
///
/// `limit` is what the context window leaves (max-model-len − prompt length).
pub fn sample_output_len(
    rng: &mut Rng,
    max_tokens: Option<u32>,
    ignore_eos: bool,
    limit: usize,
) -> usize {
    let limit = limit.max(1);
    match max_tokens {
        Some(m) => {
            let m = (m as usize).clamp(1, limit);
            if ignore_eos {
                m
            } else {
                bucketed(rng, m)
            }
        }
        None if limit < 20 => rng.range(1, limit as u64) as usize,
        None => (rng.normal(40.0, 20.0).round() as i64).clamp(1, limit as i64) as usize,
    }
}

fn bucketed(rng: &mut Rng, max: usize) -> usize {
    if max <= BUCKET_PROBABILITIES.len() {
        return rng.range(1, max as u64) as usize;
    }
    let draw = rng.next_f64();
    let mut acc = 0.0;
    let mut bucket = BUCKET_PROBABILITIES.len() - 1;
    for (i, p) in BUCKET_PROBABILITIES.iter().enumerate() {
        acc += p;
        if draw < acc {
            bucket = i;
            break;
        }
    }
    let (lo, hi) = bucket_bounds(max, bucket);
    rng.range(lo as u64, hi as u64) as usize
}

/// Inclusive token range of `bucket` for outputs of at most `max` tokens.
fn bucket_bounds(max: usize, bucket: usize) -> (usize, usize) {
    let n = BUCKET_PROBABILITIES.len();
    if max <= 120 {
        let width = max / n;
        let lo = bucket * width + 1;
        let hi = if bucket == n - 1 {
            max
        } else {
            (bucket + 1) * width
        };
        return (lo, hi);
    }
    match bucket {
        0..=2 => (bucket * 20 + 1, bucket * 20 + 20),
        3 => (61, max - 40),
        4 => (max - 39, max - 20),
        _ => (max - 19, max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_stay_within_max_tokens_and_ignore_eos_is_exact() {
        let mut rng = Rng::new(3);
        for max in [1u32, 2, 7, 50, 120, 121, 500] {
            for _ in 0..200 {
                let n = sample_output_len(&mut rng, Some(max), false, 10_000);
                assert!((1..=max as usize).contains(&n), "{n} for max {max}");
            }
            assert_eq!(
                sample_output_len(&mut rng, Some(max), true, 10_000),
                max as usize
            );
        }
        // The context window caps max_tokens.
        assert_eq!(sample_output_len(&mut rng, Some(100), true, 30), 30);
    }

    #[test]
    fn default_length_is_around_forty() {
        let mut rng = Rng::new(5);
        let total: usize = (0..2000)
            .map(|_| sample_output_len(&mut rng, None, false, 4000))
            .sum();
        let mean = total as f64 / 2000.0;
        assert!((35.0..45.0).contains(&mean), "mean {mean}");
        for _ in 0..100 {
            assert!(sample_output_len(&mut rng, None, false, 10) <= 10);
        }
    }

    #[test]
    fn buckets_cover_the_range_without_gaps() {
        for max in [7usize, 60, 120, 121, 1000] {
            let mut next = 1;
            for b in 0..6 {
                let (lo, hi) = bucket_bounds(max, b);
                assert_eq!(lo, next, "bucket {b} of {max}");
                assert!(hi >= lo);
                next = hi + 1;
            }
            assert_eq!(next, max + 1);
        }
    }
}
