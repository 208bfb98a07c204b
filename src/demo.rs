//! Demo data: realistic chart entries that need a release-group and a
//! recording match, generated deterministically (the same set every time).

use std::io::Write;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const ARTISTS: &[&str] = &[
    "The Night Owls",
    "Marisol Vega",
    "Kestrel",
    "Bright Harbour",
    "DJ Lumen",
    "Ana Kovač",
    "Paper Satellites",
    "The Velvet Tide",
    "Oskar Lind",
    "Juniper & Ash",
    "Hollow Pines",
    "Nadia Rahman",
    "Electric Orchard",
    "Sunday Static",
    "Tomás Ferreira",
    "Glass Animals Club",
    "Ruby Fontaine",
    "North Sea Radio",
    "Yuki Aoyama",
    "Copper Lanterns",
];
const WORDS: &[&str] = &[
    "Midnight",
    "Summer",
    "Echoes",
    "Gold",
    "River",
    "Neon",
    "Heart",
    "Paper",
    "Fire",
    "Blue",
    "Wild",
    "Silver",
    "Ghost",
    "Velvet",
    "Lights",
    "Highway",
    "Ocean",
    "Shadow",
    "Runaway",
    "Honey",
    "Static",
    "Bloom",
    "Glass",
    "Satellite",
];
const CHARTS: &[&str] = &[
    "UK Singles",
    "Billboard Hot 100",
    "ARIA Singles",
    "Dutch Top 40",
    "Ö3 Austria Top 40",
];
const TYPES: &[&str] = &["Single", "Album", "EP", "Compilation"];

/// A UUID-shaped id from random bits (MusicBrainz ids look like this).
fn mbid(rng: &mut StdRng) -> String {
    let b: [u8; 16] = rng.random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

fn title(rng: &mut StdRng) -> String {
    let n = rng.random_range(1..=3);
    (0..n)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Write `n` chart entries as JSONL (`id` plus evidence fields).
pub fn write_chart_items(out: &mut dyn Write, n: usize, seed: u64) -> std::io::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..n {
        let artist = ARTISTS[rng.random_range(0..ARTISTS.len())];
        let song = title(&mut rng);
        let year = rng.random_range(1985..=2025);
        let ncand = rng.random_range(1..=3);
        let candidates: Vec<_> = (0..ncand)
            .map(|k| {
                // The first candidate is usually the right one; others are
                // remasters, live versions or a namesake.
                let (t, a, ty) = match k {
                    0 => (
                        song.clone(),
                        artist.to_string(),
                        TYPES[rng.random_range(0..2)],
                    ),
                    1 => (
                        format!("{song} (Remastered)"),
                        artist.to_string(),
                        TYPES[rng.random_range(1..4)],
                    ),
                    _ => (
                        song.clone(),
                        ARTISTS[rng.random_range(0..ARTISTS.len())].to_string(),
                        "Single",
                    ),
                };
                let secs = rng.random_range(150..330);
                json!({
                    "crg_mbid": mbid(&mut rng),
                    "title": t,
                    "artist": a,
                    "type": ty,
                    "first_release": year + k * rng.random_range(0..6),
                    "rr_mbid": mbid(&mut rng),
                    "recording_title": if k == 1 { format!("{song} (Live)") } else { song.clone() },
                    "length": format!("{}:{:02}", secs / 60, secs % 60),
                })
            })
            .collect();
        let row = json!({
            "id": format!("chart-{:06}", i + 1),
            "chart": CHARTS[rng.random_range(0..CHARTS.len())],
            "week": format!("{year}-{:02}-{:02}", rng.random_range(1..=12), rng.random_range(1..=28)),
            "position": rng.random_range(1..=100),
            "artist": artist,
            "title": song,
            "candidates": candidates,
        });
        serde_json::to_writer(&mut *out, &row)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_deterministic_and_well_formed() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        write_chart_items(&mut a, 20, 7).unwrap();
        write_chart_items(&mut b, 20, 7).unwrap();
        assert_eq!(a, b);
        let text = String::from_utf8(a).unwrap();
        let rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 20);
        assert_eq!(rows[0]["id"], "chart-000001");
        let c = &rows[0]["candidates"][0];
        let re =
            regex::Regex::new(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-a[0-9a-f]{3}-[0-9a-f]{12}$")
                .unwrap();
        assert!(re.is_match(c["crg_mbid"].as_str().unwrap()), "{c}");
    }
}
