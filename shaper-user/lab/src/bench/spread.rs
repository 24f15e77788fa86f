//! Summaries of repeated measurements.

/// Median of a sample (not empty).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Repeated measurements of one figure: every run, the median, and the extremes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: Vec<f64>,
}

impl Summary {
    /// Of `runs` (not empty).
    pub fn of(runs: Vec<f64>) -> Self {
        Summary {
            median: median(&runs),
            min: runs.iter().copied().fold(f64::INFINITY, f64::min),
            max: runs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            runs,
        }
    }

    /// Run by run, `self` over `other` (same number of runs, paired).
    pub fn ratio_to(&self, other: &Summary) -> Summary {
        Summary::of(
            self.runs
                .iter()
                .zip(&other.runs)
                .map(|(a, b)| a / b)
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_and_paired_ratios() {
        let s = Summary::of(vec![3.0, 1.0, 2.0, 10.0]);
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 10.0));
        let r = Summary::of(vec![6.0, 1.0, 4.0, 10.0]).ratio_to(&s);
        assert_eq!(r.runs, [2.0, 1.0, 2.0, 1.0]);
        assert_eq!((r.median, r.min, r.max), (1.5, 1.0, 2.0));
    }
}
