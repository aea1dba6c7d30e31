//! Percentiles and summaries of samples (milliseconds, counts).

use serde_json::{json, Value};

/// The distribution of a set of samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// The `p`-th percentile (0 < p <= 100) of sorted samples, nearest-rank: the smallest
/// sample such that at least p % of the samples are less than or equal to it.
/// `None` when there are no samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    let i = rank.clamp(1, sorted.len()) - 1;
    sorted.get(i).copied()
}

impl Summary {
    /// Summarises the samples (NaNs are dropped); `None` when there are none.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let mut s: Vec<f64> = samples.iter().copied().filter(|v| !v.is_nan()).collect();
        if s.is_empty() {
            return None;
        }
        s.sort_by(f64::total_cmp);
        let sum: f64 = s.iter().sum();
        Some(Summary {
            count: s.len(),
            mean: sum / s.len() as f64,
            min: s[0],
            p50: percentile(&s, 50.0)?,
            p90: percentile(&s, 90.0)?,
            p99: percentile(&s, 99.0)?,
            max: s[s.len() - 1],
        })
    }

    /// As JSON, values rounded to microseconds (when the unit is ms).
    pub fn to_json(&self) -> Value {
        let r = |v: f64| (v * 1000.0).round() / 1000.0;
        json!({
            "count": self.count,
            "mean": r(self.mean),
            "min": r(self.min),
            "p50": r(self.p50),
            "p90": r(self.p90),
            "p99": r(self.p99),
            "max": r(self.max),
        })
    }
}

/// [`Summary::of`] as JSON (`null` when there are no samples).
pub fn summary_json(samples: &[f64]) -> Value {
    Summary::of(samples).map_or(Value::Null, |s| s.to_json())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 50.0), Some(50.0));
        assert_eq!(percentile(&s, 90.0), Some(90.0));
        assert_eq!(percentile(&s, 99.0), Some(99.0));
        assert_eq!(percentile(&s, 100.0), Some(100.0));
        assert_eq!(percentile(&s, 0.1), Some(1.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        // 10 samples: p99 is the largest, p50 the 5th.
        let s: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&s, 99.0), Some(10.0));
        assert_eq!(percentile(&s, 50.0), Some(5.0));
    }

    #[test]
    fn summary_sorts_and_ignores_nan() {
        let s = Summary::of(&[5.0, 1.0, f64::NAN, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.count, 5);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 5.0);
        assert_eq!(s.mean, 3.0);
        assert_eq!(s.p50, 3.0);
        assert_eq!(s.p99, 5.0);
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::NAN]).is_none());
        assert_eq!(summary_json(&[]), Value::Null);
        assert_eq!(summary_json(&[1.23456])["p50"], 1.235);
    }
}
