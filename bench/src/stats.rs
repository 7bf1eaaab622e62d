//! Order statistics over wall-time samples.

use std::time::Duration;

/// The figures reported for one (tool, workload) pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: Duration,
    pub p99: Duration,
    pub min: Duration,
}

/// Median (mean of the two middle samples for an even count), nearest-rank p99 and minimum;
/// `None` for no samples.
pub fn summarize(samples: &[Duration]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2
    };
    Some(Summary {
        median,
        p99: sorted[nearest_rank(n, 0.99)],
        min: sorted[0],
    })
}

/// Index of the nearest-rank percentile `p` (0 < p <= 1) among `n` sorted samples.
fn nearest_rank(n: usize, p: f64) -> usize {
    let rank = (p * n as f64).ceil() as usize;
    rank.clamp(1, n) - 1
}

/// Milliseconds with a fractional part, for printing.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(
            summarize(&millis(&[5, 1, 3])).unwrap().median,
            Duration::from_millis(3)
        );
        assert_eq!(
            summarize(&millis(&[4, 1, 3, 2])).unwrap().median,
            Duration::from_micros(2500)
        );
    }

    #[test]
    fn p99_is_nearest_rank() {
        let samples: Vec<u64> = (1..=200).collect();
        let s = summarize(&millis(&samples)).unwrap();
        assert_eq!(s.p99, Duration::from_millis(198));
        assert_eq!(s.min, Duration::from_millis(1));
        assert_eq!(
            summarize(&millis(&[7])).unwrap().p99,
            Duration::from_millis(7)
        );
    }

    #[test]
    fn no_samples_no_summary() {
        assert_eq!(summarize(&[]), None);
    }
}
