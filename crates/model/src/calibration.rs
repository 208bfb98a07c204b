//! Calibration: how often humans agreed with the model, per confidence
//! band, and which auto-accept threshold the agreement supports.
//!
//! Pure arithmetic over reviewed items (`docket calibrate` reads them from
//! the ledger). The choices, documented in the README's "Calibrating
//! thresholds":
//! - bands are 0.05 wide (`[0.00, 0.05)` .. `[0.95, 1.00]`, the last one
//!   closed), fine enough to place a threshold, and the edges are the
//!   thresholds a suggestion can take;
//! - every rate comes with a 95% Wilson score interval, which stays inside
//!   0..1 and is honest for small counts and rates near 1 (where the normal
//!   approximation claims certainty it does not have);
//! - a suggested threshold is the lowest edge whose measured precision
//!   (agreement over the reviewed items at or above it) has a Wilson LOWER
//!   bound at or above the target: the point estimate would let 20 lucky
//!   reviews "prove" 0.98, the lower bound asks for enough evidence.

/// z for a two-sided 95% interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// The width of a confidence band.
pub const BAND_WIDTH: f64 = 0.05;

/// Below this many reviewed items nothing is estimated at all.
pub const MIN_REVIEWED: u64 = 10;

/// One item a human decided: the model's confidence, and whether the human
/// took the model's suggestion as it was.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reviewed {
    pub confidence: f64,
    pub agreed: bool,
    /// Sent to review by the audit sample (its route was accept or reject).
    pub audit: bool,
}

/// A closed interval of rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
}

/// The Wilson score interval for `agreed` successes out of `n`, at `z`;
/// `None` for `n == 0` (no data, no interval).
pub fn wilson(agreed: u64, n: u64, z: f64) -> Option<Interval> {
    if n == 0 {
        return None;
    }
    let n_f = n as f64;
    let p = agreed.min(n) as f64 / n_f;
    let z2 = z * z;
    let denom = 1.0 + z2 / n_f;
    let centre = p + z2 / (2.0 * n_f);
    let spread = z * (p * (1.0 - p) / n_f + z2 / (4.0 * n_f * n_f)).sqrt();
    Some(Interval {
        lo: ((centre - spread) / denom).clamp(0.0, 1.0),
        hi: ((centre + spread) / denom).clamp(0.0, 1.0),
    })
}

/// Agreement over a set of reviewed items.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    pub reviewed: u64,
    pub agreed: u64,
    /// `agreed / reviewed`; `None` with nothing reviewed.
    pub rate: Option<f64>,
    pub interval: Option<Interval>,
}

impl Agreement {
    pub fn of<'a>(items: impl IntoIterator<Item = &'a Reviewed>) -> Self {
        let (mut reviewed, mut agreed) = (0u64, 0u64);
        for r in items {
            reviewed += 1;
            agreed += u64::from(r.agreed);
        }
        Self {
            reviewed,
            agreed,
            rate: (reviewed > 0).then(|| agreed as f64 / reviewed as f64),
            interval: wilson(agreed, reviewed, Z95),
        }
    }
}

/// One confidence band `[lo, hi)` (the last one includes 1.0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Band {
    pub lo: f64,
    pub hi: f64,
    pub agreement: Agreement,
    /// How many of its reviewed items came from the audit sample.
    pub audited: u64,
}

/// The number of bands: 1.0 / BAND_WIDTH.
const BANDS: usize = 20;

/// The edge `i` of the band grid (0.00, 0.05, .. 1.00), rounded so that
/// `edge(17)` is exactly 0.85 as a user writes it.
pub fn edge(i: usize) -> f64 {
    (i as f64 * BAND_WIDTH * 100.0).round() / 100.0
}

fn band_of(confidence: f64) -> usize {
    // Rounded to 1e-9 first: 0.85 must fall in [0.85, 0.90), though
    // 0.85 / 0.05 is 16.999.. in binary.
    let k = ((confidence / BAND_WIDTH) * 1e9).round() / 1e9;
    (k.floor().max(0.0) as usize).min(BANDS - 1)
}

/// Every band, in order, the empty ones included.
pub fn bands(items: &[Reviewed]) -> Vec<Band> {
    let mut per: Vec<Vec<Reviewed>> = vec![Vec::new(); BANDS];
    for r in items.iter().filter(|r| r.confidence.is_finite()) {
        per[band_of(r.confidence)].push(*r);
    }
    per.iter()
        .enumerate()
        .map(|(i, rs)| Band {
            lo: edge(i),
            hi: edge(i + 1),
            agreement: Agreement::of(rs),
            audited: rs.iter().filter(|r| r.audit).count() as u64,
        })
        .collect()
}

/// Measured precision of auto-accepting at `threshold`: agreement over the
/// reviewed items whose confidence is at or above it.
pub fn precision_at(items: &[Reviewed], threshold: f64) -> Agreement {
    Agreement::of(
        items
            .iter()
            .filter(|r| at_or_above(r.confidence, threshold)),
    )
}

/// `c >= t`, forgiving the last bit of binary rounding (0.85 stored as
/// 0.8499999.. still takes the higher band, as routing's thresholds do with
/// the same literal).
fn at_or_above(c: f64, t: f64) -> bool {
    c >= t - 1e-9
}

/// A threshold that reaches the target, with what it changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Suggestion {
    pub threshold: f64,
    pub precision: Agreement,
    /// Reviews it would have meant on the session's items, minus the
    /// reviews the current thresholds meant (negative: fewer).
    pub review_change: i64,
}

/// The lowest band edge (not below `review_threshold`) whose measured
/// precision has a Wilson lower bound at or above `target`; `None` when no
/// edge does with the reviews so far. `confidences` are every routed
/// item's confidence in the session, to count the reviews each threshold
/// means (items in `[review_threshold, threshold)`).
pub fn suggest(
    items: &[Reviewed],
    confidences: &[f64],
    review_threshold: f64,
    current_accept: f64,
    target: f64,
) -> Option<Suggestion> {
    let reviews_at = |t: f64| {
        confidences
            .iter()
            .filter(|&&c| at_or_above(c, review_threshold) && !at_or_above(c, t))
            .count() as i64
    };
    let now = reviews_at(current_accept);
    (0..=BANDS)
        .map(edge)
        .filter(|&t| at_or_above(t, review_threshold))
        .find_map(|t| {
            let precision = precision_at(items, t);
            let lower = precision.interval?.lo;
            (lower >= target).then(|| Suggestion {
                threshold: t,
                precision,
                review_change: reviews_at(t) - now,
            })
        })
}

/// The target precision when none is given (`docket calibrate`'s default,
/// and what the console's calibration view aims at).
pub const DEFAULT_TARGET: f64 = 0.98;

/// Everything a calibration report shows, for `docket calibrate` and the
/// console's calibration view alike (one computation, two renderings).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub target: f64,
    /// The auto-accept and review thresholds the session routed with.
    pub accept: f64,
    pub review: f64,
    pub overall: Agreement,
    /// Reviewed items that came from the audit sample.
    pub audited: u64,
    /// Enough reviewed items to estimate anything ([`MIN_REVIEWED`]).
    pub enough: bool,
    pub bands: Vec<Band>,
    /// The precision the current auto-accept threshold gives.
    pub current: Agreement,
    /// The lowest threshold that reaches `target`, when one does.
    pub suggestion: Option<Suggestion>,
}

impl Summary {
    /// The report on `items` (reviewed) among `confidences` (every routed
    /// item's), for a session that routed with `accept` and `review`.
    pub fn of(
        items: &[Reviewed],
        confidences: &[f64],
        accept: f64,
        review: f64,
        target: f64,
    ) -> Summary {
        let overall = Agreement::of(items);
        let enough = overall.reviewed >= MIN_REVIEWED;
        Summary {
            target,
            accept,
            review,
            audited: items.iter().filter(|r| r.audit).count() as u64,
            enough,
            bands: bands(items),
            current: precision_at(items, accept),
            suggestion: enough
                .then(|| suggest(items, confidences, review, accept, target))
                .flatten(),
            overall,
        }
    }
}

/// The audit decision for an item: a stable hash of session and item,
/// mapped to [0, 1), below `share`. The same session and item decide the
/// same way on a resume or in another worker (no random state).
pub fn audit_pick(session_id: &str, item_id: &str, share: f64) -> bool {
    if share <= 0.0 {
        return false;
    }
    let digest = crate::ids::sha256_hex(format!("audit\0{session_id}\0{item_id}").as_bytes());
    // 13 hex digits: 52 bits, exact in an f64.
    let x = u64::from_str_radix(&digest[..13], 16).unwrap_or(0) as f64 / (1u64 << 52) as f64;
    x < share
}

#[cfg(test)]
mod tests;
