//! The comparison's statistics, pure: the Wilson score interval of a rate, the quantiles of a
//! sample with their distribution-free (order-statistic) interval, and a bootstrap over runs of
//! a pooled ratio. No runtime, no I/O: table tests below.

/// The normal quantile of a two-sided 95 % interval.
const Z95: f64 = 1.959_963_984_540_054;

/// A rate with its 95 % interval (all three in 0..=1).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Rate {
    pub(crate) k: u64,
    pub(crate) n: u64,
    pub(crate) rate: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
}

/// `k` of `n` with its 95 % Wilson score interval (Wilson 1927); `None` with `n = 0`. Chosen
/// over the normal (Wald) interval because it stays inside [0, 1] and is not empty at `k = 0`,
/// the case this table is about: 0 false kills of `n` gives `[0, z²/(n + z²)]`.
pub(crate) fn wilson(k: u64, n: u64) -> Option<Rate> {
    if n == 0 || k > n {
        return None;
    }
    let (kf, nf, z2) = (k as f64, n as f64, Z95 * Z95);
    let p = kf / nf;
    let centre = (p + z2 / (2.0 * nf)) / (1.0 + z2 / nf);
    let half = Z95 / (1.0 + z2 / nf) * (p * (1.0 - p) / nf + z2 / (4.0 * nf * nf)).sqrt();
    // At k = 0 (or n) the bound is exactly 0 (or 1); rounding must not move it.
    let low = if k == 0 {
        0.0
    } else {
        (centre - half).max(0.0)
    };
    let high = if k == n {
        1.0
    } else {
        (centre + half).min(1.0)
    };
    Some(Rate {
        k,
        n,
        rate: p,
        low,
        high,
    })
}

/// A quantile of a sample and, where the sample is large enough, its 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Quantile {
    pub(crate) value: f64,
    /// The order statistics `[X(l), X(u)]` that cover the true quantile with at least 95 %
    /// probability whatever the distribution; `None`: no pair of this sample does (a median
    /// needs 6 values, a p90 29).
    pub(crate) interval: Option<(f64, f64)>,
}

/// The `p`-quantile (0 < p < 1) of `v` by the nearest rank (`X(⌈p·n⌉)`, a value of the sample,
/// as the runner's median is), with its order-statistic interval; `None` for an empty sample.
pub(crate) fn quantile(v: &[f64], p: f64) -> Option<Quantile> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() || !(p > 0.0 && p < 1.0) {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
    Some(Quantile {
        value: s[rank - 1],
        interval: order_interval(n, p).map(|(l, u)| (s[l - 1], s[u - 1])),
    })
}

/// The narrowest ranks `(l, u)`, 1-based, with `P(X(l) ≤ ξ_p ≤ X(u)) ≥ 0.95` for any
/// continuous distribution: that coverage is `P(l ≤ B < u)` with `B ~ Binomial(n, p)`. Ties
/// on width go to the higher coverage. `None` when even `(1, n)` covers less.
pub(crate) fn order_interval(n: usize, p: f64) -> Option<(usize, usize)> {
    // pmf[i] = P(B = i), built by the ratio of successive terms (no factorials to overflow).
    let mut pmf = vec![0.0f64; n + 1];
    pmf[0] = (1.0 - p).powi(n as i32);
    for i in 1..=n {
        pmf[i] = pmf[i - 1] * ((n - i + 1) as f64 / i as f64) * (p / (1.0 - p));
    }
    // cdf[i] = P(B < i).
    let mut cdf = vec![0.0f64; n + 2];
    for i in 0..=n {
        cdf[i + 1] = cdf[i] + pmf[i];
    }
    let mut best: Option<(usize, usize, f64)> = None;
    for l in 1..=n {
        for u in l + 1..=n {
            let cover = cdf[u] - cdf[l];
            if cover < 0.95 {
                continue;
            }
            let better = match best {
                None => true,
                Some((bl, bu, bc)) => u - l < bu - bl || (u - l == bu - bl && cover > bc),
            };
            if better {
                best = Some((l, u, cover));
            }
        }
    }
    best.map(|(l, u, _)| (l, u))
}

/// Availability over runs: the mean of each run's completed / attempted, every run weighing
/// the same, with a 95 % percentile-bootstrap interval that resamples whole runs (the requests
/// of one run share its fault, so they are not independent and a Wilson interval over requests
/// would be too narrow). Not Σ completed / Σ attempted: after a kill the load's retries against
/// the closed port fail in microseconds, so a run with a kill would count thousands of attempts
/// and outweigh every other run. The sums are kept for the report.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Pooled {
    pub(crate) completed: u64,
    pub(crate) attempted: u64,
    /// The mean of the runs' ratios (runs that attempted nothing left out).
    pub(crate) ratio: f64,
    /// `None` with fewer than 2 runs (a bootstrap of one run says nothing).
    pub(crate) interval: Option<(f64, f64)>,
}

/// Resamples of the bootstrap: enough for the 2.5 % and 97.5 % points to be steady to a
/// few tenths of a percent.
const RESAMPLES: usize = 2000;

/// `runs` as `(completed, attempted)`: the mean of their ratios, with the bootstrap interval
/// (a fixed seed: the same outcomes always give the same table). `None` when nothing was
/// attempted.
pub(crate) fn pooled(runs: &[(u64, u64)]) -> Option<Pooled> {
    let (completed, attempted) = runs
        .iter()
        .fold((0u64, 0u64), |(c, a), &(rc, ra)| (c + rc, a + ra));
    let ratios: Vec<f64> = runs
        .iter()
        .filter(|&&(_, a)| a > 0)
        .map(|&(c, a)| c as f64 / a as f64)
        .collect();
    if ratios.is_empty() {
        return None;
    }
    let mean = |xs: &mut dyn Iterator<Item = f64>| {
        let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
        sum / n as f64
    };
    let interval = (ratios.len() >= 2).then(|| {
        let mut rng = SplitMix(0x5eed_0051);
        let mut means: Vec<f64> = (0..RESAMPLES)
            .map(|_| {
                mean(
                    &mut (0..ratios.len())
                        .map(|_| ratios[(rng.next() % ratios.len() as u64) as usize]),
                )
            })
            .collect();
        means.sort_by(f64::total_cmp);
        let at = |q: f64| means[(q * (means.len() - 1) as f64).round() as usize];
        (at(0.025), at(0.975))
    });
    Some(Pooled {
        completed,
        attempted,
        ratio: mean(&mut ratios.iter().copied()),
        interval,
    })
}

/// SplitMix64 (Steele, Lea, Flood 2014): a small seeded generator, enough for resampling.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::{order_interval, pooled, quantile, wilson};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 5e-5
    }

    #[test]
    fn wilson_intervals_match_the_published_values() {
        // (k, n, low, high): 0 of n is [0, z²/(n+z²)]; the others from Newcombe (1998),
        // table I, and R's prop.test(correct = FALSE).
        let table = [
            (0, 10, 0.0, 0.2775),
            (0, 100, 0.0, 0.0370),
            (5, 10, 0.2366, 0.7634),
            (81, 263, 0.2553, 0.3662),
            (15, 148, 0.0624, 0.1605),
            (10, 10, 0.7225, 1.0),
        ];
        for (k, n, low, high) in table {
            let r = wilson(k, n).expect("n > 0");
            assert!(close(r.low, low) && close(r.high, high), "{k}/{n}: {r:?}");
        }
        assert_eq!(wilson(0, 0), None);
        assert_eq!(wilson(3, 2), None, "more successes than trials");
    }

    #[test]
    fn the_median_interval_takes_the_ranks_of_the_binomial_tables() {
        // The classic: a median's 95 % interval needs 6 values, (X(1), X(6)) at 96.9 %; 10
        // values give (X(2), X(9)) at 97.9 %; 20 give (X(6), X(15)).
        assert_eq!(order_interval(5, 0.5), None);
        assert_eq!(order_interval(6, 0.5), Some((1, 6)));
        assert_eq!(order_interval(10, 0.5), Some((2, 9)));
        assert_eq!(order_interval(20, 0.5), Some((6, 15)));
        // A p90 needs 1 − 0.9ⁿ ≥ 0.95 for (X(1), X(n)) at least: n = 29.
        assert_eq!(order_interval(28, 0.9), None);
        assert!(order_interval(29, 0.9).is_some());
    }

    #[test]
    fn quantiles_are_nearest_rank_values_of_the_sample() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        let m = quantile(&v, 0.5).expect("a sample");
        assert_eq!(m.value, 5.0);
        assert_eq!(m.interval, Some((2.0, 9.0)));
        let p90 = quantile(&v, 0.9).expect("a sample");
        assert_eq!((p90.value, p90.interval), (9.0, None));
        let one = quantile(&[7.0], 0.9).expect("a sample");
        assert_eq!((one.value, one.interval), (7.0, None));
        assert_eq!(quantile(&[], 0.5), None);
        // Unsorted input, and NaN left out.
        assert_eq!(
            quantile(&[3.0, f64::NAN, 1.0, 2.0], 0.5).map(|q| q.value),
            Some(2.0)
        );
    }

    #[test]
    fn availability_weighs_every_run_the_same_and_its_interval_brackets_it() {
        // A killed run's thousands of refused retries do not outweigh the other run.
        let k = pooled(&[(0, 5000), (100, 100)]).expect("attempted");
        assert!(close(k.ratio, 0.5), "{}", k.ratio);
        assert_eq!((k.completed, k.attempted), (100, 5100));
        let p = pooled(&[(90, 100), (50, 100), (100, 100)]).expect("attempted");
        assert_eq!((p.completed, p.attempted), (240, 300));
        assert!(close(p.ratio, 0.8));
        let (lo, hi) = p.interval.expect("three runs");
        assert!(
            (0.5..=0.8).contains(&lo) && (0.8..=1.0).contains(&hi),
            "{lo} {hi}"
        );
        // Runs that agree have a point interval; one run has none.
        let same = pooled(&[(9, 10), (9, 10)]).expect("attempted");
        assert_eq!(same.interval, Some((0.9, 0.9)));
        assert_eq!(pooled(&[(9, 10)]).and_then(|p| p.interval), None);
        assert_eq!(pooled(&[(0, 0)]), None);
    }
}
