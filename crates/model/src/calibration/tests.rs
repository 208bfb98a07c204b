//! The calibration arithmetic on scripted sets with known agreement; the
//! Wilson bounds checked against values computed by hand (and by the
//! textbook formula in Python, to 1e-9).

use super::*;

fn r(confidence: f64, agreed: bool) -> Reviewed {
    Reviewed {
        confidence,
        agreed,
        audit: false,
    }
}

/// 20 at 0.92 all agreed (audit), 10 at 0.82 with 8 agreed, 10 at 0.62
/// with 3 agreed.
fn scripted() -> Vec<Reviewed> {
    let mut v = Vec::new();
    v.extend((0..20).map(|_| Reviewed {
        audit: true,
        ..r(0.92, true)
    }));
    v.extend((0..10).map(|i| r(0.82, i < 8)));
    v.extend((0..10).map(|i| r(0.62, i < 3)));
    v
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

#[test]
fn wilson_matches_hand_computed_bounds() {
    // 8 of 10: p = 0.8, the classic [0.490, 0.943].
    let i = wilson(8, 10, Z95).unwrap();
    close(i.lo, 0.490_162_471_536_641_8);
    close(i.hi, 0.943_317_848_545_624_7);
    // 20 of 20: the lower bound is n / (n + z²) = 20 / 23.8415 = 0.8389.
    let i = wilson(20, 20, Z95).unwrap();
    close(i.lo, 20.0 / (20.0 + Z95 * Z95));
    close(i.hi, 1.0);
    // 0 of 5: the upper bound is z² / (n + z²).
    let i = wilson(0, 5, Z95).unwrap();
    close(i.lo, 0.0);
    close(i.hi, Z95 * Z95 / (5.0 + Z95 * Z95));
    assert_eq!(wilson(0, 0, Z95), None);
}

#[test]
fn bands_count_agreement_per_five_hundredths() {
    let b = bands(&scripted());
    assert_eq!(b.len(), 20);
    let at = |lo: f64| b.iter().find(|x| (x.lo - lo).abs() < 1e-9).unwrap();
    assert_eq!(
        (at(0.90).agreement.reviewed, at(0.90).agreement.agreed),
        (20, 20)
    );
    assert_eq!(at(0.90).audited, 20);
    assert_eq!(
        (at(0.80).agreement.reviewed, at(0.80).agreement.agreed),
        (10, 8)
    );
    close(at(0.80).agreement.rate.unwrap(), 0.8);
    close(
        at(0.80).agreement.interval.unwrap().lo,
        0.490_162_471_536_641_8,
    );
    assert_eq!(
        (at(0.60).agreement.reviewed, at(0.60).agreement.agreed),
        (10, 3)
    );
    close(
        at(0.60).agreement.interval.unwrap().hi,
        0.603_221_852_538_854_6,
    );
    assert_eq!(at(0.10).agreement.reviewed, 0);
    assert_eq!(at(0.10).agreement.rate, None);
}

#[test]
fn band_edges_take_the_higher_band_and_one_is_in_the_last() {
    let b = bands(&[r(0.85, true), r(1.0, true), r(0.0, false)]);
    assert_eq!(b[17].agreement.reviewed, 1, "0.85 is in [0.85, 0.90)");
    assert_eq!(b[19].agreement.reviewed, 1, "1.0 is in the last band");
    assert_eq!(b[0].agreement.reviewed, 1);
    assert_eq!(edge(17), 0.85);
}

#[test]
fn precision_at_a_threshold_pools_the_items_above_it() {
    let p = precision_at(&scripted(), 0.80);
    assert_eq!((p.reviewed, p.agreed), (30, 28));
    close(p.interval.unwrap().lo, 0.786_765_416_373_830_8);
    close(p.interval.unwrap().hi, 0.981_522_976_208_729_6);
}

#[test]
fn the_suggestion_is_the_lowest_edge_whose_lower_bound_reaches_the_target() {
    let items = scripted();
    let mut conf = vec![0.92; 20];
    conf.extend([0.82; 10]);
    conf.extend([0.62; 10]);
    conf.extend([0.3; 5]);
    // At 0.80 the lower bound is 0.787 < 0.80; at 0.85 only the 20 agreed
    // items remain (lower bound 0.839).
    let s = suggest(&items, &conf, 0.6, 0.95, 0.80).unwrap();
    close(s.threshold, 0.85);
    assert_eq!((s.precision.reviewed, s.precision.agreed), (20, 20));
    // At 0.95 the 40 items in [0.6, 0.95) go to review, at 0.85 only 20.
    assert_eq!(s.review_change, -20);
    // 0.98 needs far more evidence than 20 agreements: no suggestion.
    assert_eq!(suggest(&items, &conf, 0.6, 0.95, 0.98), None);
}

#[test]
fn the_suggestion_never_goes_below_the_review_threshold() {
    // 200 agreements at 0.5 would reach 0.98 from the 0.50 edge, but an
    // auto-accept threshold below the review threshold is no threshold.
    let items: Vec<Reviewed> = (0..200).map(|_| r(0.5, true)).collect();
    assert_eq!(suggest(&items, &[0.5; 200], 0.6, 0.9, 0.98), None);
    let s = suggest(&items, &[0.5; 200], 0.5, 0.9, 0.98).unwrap();
    close(s.threshold, 0.5);
}

#[test]
fn the_audit_pick_is_stable_and_near_its_share() {
    let picked = (0..4000)
        .filter(|i| audit_pick("s1", &format!("item-{i}"), 0.1))
        .count();
    assert!((300..500).contains(&picked), "{picked} of 4000 at 0.1");
    for i in 0..50 {
        let id = format!("item-{i}");
        assert_eq!(audit_pick("s1", &id, 0.3), audit_pick("s1", &id, 0.3));
    }
    assert!(!audit_pick("s1", "x", 0.0));
    assert!(audit_pick("s1", "x", 1.0));
}
