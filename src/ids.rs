//! Random parts of docket's ids (sessions, workers): short, lowercase,
//! safe in file names, URLs and provider metadata.

/// `n` random lowercase letters and digits.
pub fn random_suffix(n: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}
