//! Random parts of docket's ids (sessions, workers): short, lowercase,
//! safe in file names, URLs and provider metadata; and the SHA-256 hex
//! digest that names templates, parameters and keys.

use sha2::{Digest, Sha256};

/// `n` random lowercase letters and digits.
pub fn random_suffix(n: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// The lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest.iter() {
        s.push(char::from(b"0123456789abcdef"[(b >> 4) as usize]));
        s.push(char::from(b"0123456789abcdef"[(b & 15) as usize]));
    }
    s
}

/// How every command says that a session id is not in the ledger (resume,
/// the controls, the reports, the console): one wording, one way out.
pub fn unknown_session(id: &str) -> String {
    format!("unknown session {id:?}; list the sessions in this ledger with `docket sessions`")
}
