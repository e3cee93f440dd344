//! Percentiles and Jain's fairness index.

/// The `q`-quantile (0..=1) of sorted values, nearest rank.
pub fn percentile(sorted: &[u32], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(f64::from(sorted[rank - 1]))
}

/// Jain's index over per-user counts: 1.0 when every user got the same, 1/n when one user got
/// everything. None when nobody got anything.
pub fn jain(counts: &[u64]) -> Option<f64> {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if counts.is_empty() || squares == 0.0 {
        return None;
    }
    Some(sum * sum / (counts.len() as f64 * squares))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_for_even_shares_and_one_over_n_for_a_monopoly() {
        assert_eq!(jain(&[5, 5, 5, 5]), Some(1.0));
        assert_eq!(jain(&[8, 0, 0, 0]), Some(0.25));
        assert_eq!(jain(&[0, 0]), None);
        let uneven = jain(&[3, 4, 3, 4]).expect("defined");
        assert!(uneven > 0.97 && uneven < 1.0);
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
