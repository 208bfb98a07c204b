//! Confidence routing: auto-accept, review, reject.
//!
//! `--min-confidence` is a floor on auto-acceptance: an answer is accepted
//! only when its confidence is at least both the auto-accept threshold and the
//! floor. Anything below that but at or above the review threshold goes to
//! human review; below the review threshold it is rejected. Boundaries are
//! inclusive on the upper band (confidence == threshold takes the higher band).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Accepted,
    Review,
    Rejected,
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Review => "review",
            Outcome::Rejected => "rejected",
            Outcome::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    pub auto_accept: f64,
    pub review: f64,
    pub min_confidence: Option<f64>,
}

/// The routing thresholds a session ran with, `(review, auto_accept)`,
/// from its config snapshot (`{"flags": ..., "config": ...}`): the flags
/// the run used, else the config's `[routing]`; the auto-accept raised to
/// the `--min-confidence` floor. `None` where the snapshot has neither (or
/// a value out of 0..1). The console's histogram, the report's and
/// `docket calibrate` read them alike.
pub fn session_thresholds(snapshot: &serde_json::Value) -> (Option<f64>, Option<f64>) {
    let num = |ptr: &str| {
        snapshot
            .pointer(ptr)
            .and_then(serde_json::Value::as_f64)
            .filter(|x| (0.0..=1.0).contains(x))
    };
    let pick = |key: &str| {
        num(&format!("/flags/{key}")).or_else(|| num(&format!("/config/routing/{key}")))
    };
    let accept = match (pick("auto_accept_threshold"), num("/flags/min_confidence")) {
        (Some(a), Some(floor)) => Some(a.max(floor)),
        (a, floor) => a.or(floor),
    };
    (pick("review_threshold"), accept)
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ThresholdError {
    #[error("{name} {value} is out of range (0.0 to 1.0)")]
    OutOfRange { name: &'static str, value: f64 },
    #[error("review threshold {review} is above the auto-accept threshold {auto_accept}")]
    Inverted { review: f64, auto_accept: f64 },
}

impl Thresholds {
    pub fn new(
        auto_accept: f64,
        review: f64,
        min_confidence: Option<f64>,
    ) -> Result<Self, ThresholdError> {
        for (name, value) in [
            ("--auto-accept-threshold", Some(auto_accept)),
            ("--review-threshold", Some(review)),
            ("--min-confidence", min_confidence),
        ] {
            if let Some(v) = value
                && !(v.is_finite() && (0.0..=1.0).contains(&v))
            {
                return Err(ThresholdError::OutOfRange { name, value: v });
            }
        }
        if review > auto_accept {
            return Err(ThresholdError::Inverted {
                review,
                auto_accept,
            });
        }
        Ok(Self {
            auto_accept,
            review,
            min_confidence,
        })
    }

    /// The confidence an answer needs to be auto-accepted.
    pub fn effective_accept(&self) -> f64 {
        self.auto_accept.max(self.min_confidence.unwrap_or(0.0))
    }

    pub fn route(&self, confidence: f64) -> Outcome {
        if confidence >= self.effective_accept() {
            Outcome::Accepted
        } else if confidence >= self.review {
            Outcome::Review
        } else {
            Outcome::Rejected
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_take_the_higher_band() {
        let t = Thresholds::new(0.85, 0.60, None).unwrap();
        assert_eq!(t.route(0.85), Outcome::Accepted);
        assert_eq!(t.route(0.849_999), Outcome::Review);
        assert_eq!(t.route(0.60), Outcome::Review);
        assert_eq!(t.route(0.599_999), Outcome::Rejected);
        assert_eq!(t.route(1.0), Outcome::Accepted);
        assert_eq!(t.route(0.0), Outcome::Rejected);
    }

    #[test]
    fn min_confidence_raises_the_accept_bar_only() {
        let t = Thresholds::new(0.80, 0.50, Some(0.90)).unwrap();
        assert_eq!(t.route(0.85), Outcome::Review);
        assert_eq!(t.route(0.90), Outcome::Accepted);
        assert_eq!(t.route(0.55), Outcome::Review);
        let lower = Thresholds::new(0.80, 0.50, Some(0.10)).unwrap();
        assert_eq!(lower.route(0.70), Outcome::Review);
    }

    #[test]
    fn accept_threshold_one_sends_everything_below_to_review() {
        let t = Thresholds::new(1.0, 0.6, None).unwrap();
        assert_eq!(t.route(0.99), Outcome::Review);
    }

    #[test]
    fn invalid_thresholds_are_rejected() {
        assert_eq!(
            Thresholds::new(0.5, 0.7, None),
            Err(ThresholdError::Inverted {
                review: 0.7,
                auto_accept: 0.5
            })
        );
        assert!(matches!(
            Thresholds::new(1.5, 0.7, None),
            Err(ThresholdError::OutOfRange { .. })
        ));
        assert!(matches!(
            Thresholds::new(0.9, 0.7, Some(f64::NAN)),
            Err(ThresholdError::OutOfRange { .. })
        ));
    }

    /// A session's thresholds: its flags over its config's, the accept
    /// raised to the floor, nothing made up where the snapshot has none.
    #[test]
    fn a_sessions_thresholds_come_from_its_flags_then_its_config() {
        use super::session_thresholds;
        use serde_json::json;
        let config = json!({"config": {"routing": {"auto_accept_threshold": 0.85, "review_threshold": 0.6}}});
        assert_eq!(session_thresholds(&config), (Some(0.6), Some(0.85)));
        let flags = json!({
            "flags": {"auto_accept_threshold": 0.9, "review_threshold": null, "min_confidence": 0.95},
            "config": {"routing": {"auto_accept_threshold": 0.85, "review_threshold": 0.6}}
        });
        assert_eq!(session_thresholds(&flags), (Some(0.6), Some(0.95)));
        let out_of_range = json!({"flags": {"auto_accept_threshold": 1.5}});
        assert_eq!(session_thresholds(&out_of_range), (None, None));
        assert_eq!(
            session_thresholds(&json!({"flags": {"min_confidence": 0.7}})),
            (None, Some(0.7))
        );
    }
}
