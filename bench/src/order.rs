//! The order of each round's runs.
//!
//! Work a sandbox leaves to the kernel when it exits (a network namespace's cleanup, RCU callbacks,
//! a cgroup's release) runs during whatever comes next. A plain rotation puts each pair right after
//! the same neighbour in almost every round, so one pair can pay for another's teardown every time:
//! with one build in both airlock slots (an A/A run) the slot after the other airlock slot measured
//! 3-7 ms slower at load 5, 0.95 ms slower near idle. A Williams design (a balanced Latin square)
//! puts every pair right after every other pair equally often, and first equally often, over `n`
//! rounds (`2n` when `n` is odd).

/// The order of `n` pairs in `round`.
pub fn round_order(round: usize, n: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    // 0, 1, n-1, 2, n-2, ...: shifted by the round, each difference between neighbours occurs
    // once per row, so each ordered pair of neighbours once per n rows.
    let first_row = (0..n).map(|j| {
        if j % 2 == 1 {
            j.div_ceil(2)
        } else {
            (n - j / 2) % n
        }
    });
    let period = if n.is_multiple_of(2) { n } else { 2 * n };
    let row = round % period;
    let mut order: Vec<usize> = first_row.map(|pair| (pair + row) % n).collect();
    // For odd n the differences repeat in pairs; the reversed rows balance them.
    if row >= n {
        order.reverse();
    }
    order
}

#[cfg(test)]
mod tests {
    use super::round_order;
    use std::collections::HashMap;

    #[test]
    fn every_pair_follows_every_other_equally_often_and_leads_equally_often() {
        for n in 1..=9usize {
            let period = if n.is_multiple_of(2) { n } else { 2 * n };
            let mut follows: HashMap<(usize, usize), usize> = HashMap::new();
            let mut leads = vec![0; n];
            for round in 0..period {
                let order = round_order(round, n);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n={n} round={round}");
                leads[order[0]] += 1;
                for step in order.windows(2) {
                    *follows.entry((step[0], step[1])).or_default() += 1;
                }
            }
            let times = period / n;
            assert!(leads.iter().all(|&l| l == times), "n={n}: {leads:?}");
            assert_eq!(follows.len(), n * (n - 1), "n={n}: {follows:?}");
            assert!(follows.values().all(|&c| c == times), "n={n}: {follows:?}");
        }
    }
}
