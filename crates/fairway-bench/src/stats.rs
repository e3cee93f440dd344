//! Percentiles, Jain's fairness index and the highest index a count of items allows.

/// The `q`-quantile (0..=1) of sorted values, nearest rank.
pub fn percentile(sorted: &[u32], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(f64::from(sorted[rank - 1]))
}

/// Jain's index over per-user shares (items served, or items served divided by weight): 1.0
/// when every user got the same, 1/n when one user got everything. None when nobody got
/// anything.
pub fn jain(counts: &[f64]) -> Option<f64> {
    let sum: f64 = counts.iter().sum();
    let squares: f64 = counts.iter().map(|c| c * c).sum();
    if counts.is_empty() || squares == 0.0 {
        return None;
    }
    Some(sum * sum / (counts.len() as f64 * squares))
}

/// The highest Jain index any order reaches serving `items` items to `users` users: every
/// user within one item of every other. A run that stops inside a round, with some users one
/// item ahead, scores below 1 however exact its order. None where `jain` would be.
pub fn best_jain(items: u64, users: u64) -> Option<f64> {
    if users == 0 || items == 0 {
        return None;
    }
    let (each, ahead) = (items / users, items % users);
    let squares =
        ahead as f64 * ((each + 1) as f64).powi(2) + (users - ahead) as f64 * (each as f64).powi(2);
    Some((items as f64).powi(2) / (users as f64 * squares))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_for_even_shares_and_one_over_n_for_a_monopoly() {
        assert_eq!(jain(&[5.0, 5.0, 5.0, 5.0]), Some(1.0));
        assert_eq!(jain(&[8.0, 0.0, 0.0, 0.0]), Some(0.25));
        assert_eq!(jain(&[0.0, 0.0]), None);
        let uneven = jain(&[3.0, 4.0, 3.0, 4.0]).expect("defined");
        assert!(uneven > 0.97 && uneven < 1.0);
    }

    #[test]
    fn the_best_index_is_that_of_users_within_one_item_of_each_other() {
        assert_eq!(best_jain(40, 10), Some(1.0));
        assert_eq!(best_jain(45, 10), jain(&[5.0, 5.0, 5.0, 5.0, 5.0, 4.0, 4.0, 4.0, 4.0, 4.0]));
        let mid_round = best_jain(45, 10).expect("defined");
        assert!(mid_round > 0.98 && mid_round < 0.99, "{mid_round}");
        assert_eq!(best_jain(3, 10), jain(&[1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]));
        assert_eq!(best_jain(0, 10), None);
        assert_eq!(best_jain(5, 0), None);
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&values, 0.5), Some(50.0));
        assert_eq!(percentile(&values, 0.99), Some(99.0));
        assert_eq!(percentile(&values, 1.0), Some(100.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
