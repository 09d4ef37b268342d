//! Deterministic statistics: a SplitMix64 generator, distributions, percentile quantiles and
//! the cluster bootstrap.

use super::model::EconomicsDistribution;

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and fully reproducible from its seed.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform index below `n` (multiply-shift; `n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// The `p` quantile of sorted values, linear interpolation between order statistics
/// (Hyndman & Fan type 7). `None` for no values.
pub fn quantile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let h = last as f64 * p.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(last);
    let (a, b) = (sorted[lo.min(last)], sorted[hi]);
    Some(a + (h - lo as f64) * (b - a))
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// The median (`None` for no values).
pub fn median(values: &[f64]) -> Option<f64> {
    quantile_sorted(&sorted(values), 0.5)
}

/// The distribution of `values` (`None` for no values).
pub fn distribution(values: &[f64]) -> Option<EconomicsDistribution> {
    let s = sorted(values);
    let n = s.len();
    let mean = s.iter().sum::<f64>() / n as f64;
    let sd = (n > 1).then(|| {
        let ss: f64 = s.iter().map(|x| (x - mean) * (x - mean)).sum();
        (ss / (n - 1) as f64).sqrt()
    });
    Some(EconomicsDistribution {
        n,
        mean,
        median: quantile_sorted(&s, 0.5)?,
        p25: quantile_sorted(&s, 0.25)?,
        p75: quantile_sorted(&s, 0.75)?,
        p95: quantile_sorted(&s, 0.95)?,
        min: *s.first()?,
        max: *s.last()?,
        sd,
    })
}

/// A percentile interval from a cluster bootstrap: each resample draws as many clusters as
/// there are, with replacement, pools their members and applies `stat`. Members of one
/// cluster (the repetitions of one task) always travel together, because they are not
/// independent. Resamples whose statistic is undefined are skipped. Returns `(low, high)`,
/// or `None` when there is no cluster or no defined statistic.
pub fn cluster_bootstrap<T: Clone>(
    clusters: &[Vec<T>],
    stat: impl Fn(&[T]) -> Option<f64>,
    resamples: u32,
    seed: u64,
    level_bp: u32,
) -> Option<(f64, f64)> {
    if clusters.is_empty() || resamples == 0 {
        return None;
    }
    let mut rng = SplitMix64::new(seed);
    let mut stats = Vec::with_capacity(resamples as usize);
    let mut pool: Vec<T> = Vec::new();
    for _ in 0..resamples {
        pool.clear();
        for _ in 0..clusters.len() {
            pool.extend_from_slice(&clusters[rng.below(clusters.len())]);
        }
        if let Some(s) = stat(&pool) {
            stats.push(s);
        }
    }
    stats.sort_by(f64::total_cmp);
    let alpha = (10_000.0 - f64::from(level_bp.min(10_000))) / 10_000.0;
    Some((
        quantile_sorted(&stats, alpha / 2.0)?,
        quantile_sorted(&stats, 1.0 - alpha / 2.0)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // The reference outputs of SplitMix64 seeded with 0.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn quantiles_interpolate() {
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_sorted(&s, 0.5), Some(2.5));
        assert_eq!(quantile_sorted(&s, 0.0), Some(1.0));
        assert_eq!(quantile_sorted(&s, 1.0), Some(4.0));
        assert_eq!(quantile_sorted(&[], 0.5), None);
        let d = distribution(&[0.4]).unwrap();
        assert!(d.sd.is_none() && d.median == 0.4);
    }

    #[test]
    fn one_cluster_gives_a_point_interval() {
        let mean = |v: &[f64]| Some(v.iter().sum::<f64>() / v.len() as f64);
        let i = cluster_bootstrap(&[vec![0.3, 0.5]], mean, 500, 7, 9500).unwrap();
        assert!((i.0 - 0.4).abs() < 1e-12 && (i.1 - 0.4).abs() < 1e-12);
    }

    #[test]
    fn below_is_in_range() {
        let mut r = SplitMix64::new(42);
        assert!((0..1000).all(|_| r.below(7) < 7));
    }
}
