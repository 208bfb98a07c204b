//! Numbers as an operator reads them at a glance: used by the state
//! (`app`) and the drawing (`view`) alike.

/// A duration as one unit: `45s`, `12m`, `3h`, `2d` (never negative).
pub fn human_secs(secs: f64) -> String {
    let s = if secs.is_finite() { secs.max(0.0) } else { 0.0 };
    if s < 60.0 {
        format!("{}s", s.floor() as u64)
    } else if s < 3600.0 {
        format!("{}m", (s / 60.0).floor() as u64)
    } else if s < 86_400.0 {
        format!("{}h", (s / 3600.0).floor() as u64)
    } else {
        format!("{}d", (s / 86_400.0).floor() as u64)
    }
}
