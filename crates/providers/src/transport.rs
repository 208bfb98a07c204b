//! What a send that got no HTTP answer says (fault-matrix row S5): reqwest's
//! own words ("error sending request for url (...)") name neither the cause
//! nor the layer, so the error's source chain (reqwest, hyper, then the
//! resolver, the socket or rustls) is condensed into one readable cause:
//! "DNS: failed to lookup address information: Name or service not known",
//! "connection refused", "TLS: invalid peer certificate: UnknownIssuer".
//!
//! The address shown is the request's URL without its query, fragment or
//! user info (where a key could sit; none of docket's adapters puts one
//! there), and the caller redacts anything key-shaped as for every error.

use std::error::Error as StdError;
use std::io;

/// `e` as one line: reqwest's summary with a clean URL, then the cause.
pub(crate) fn describe(e: &reqwest::Error) -> String {
    let head = head(e);
    match cause(e) {
        Some(cause) => format!("{head}: {cause}"),
        None => head,
    }
}

/// reqwest's summary of `e` ("error sending request for url (...)"), its
/// URL cleaned.
pub(crate) fn head(e: &reqwest::Error) -> String {
    let text = e.to_string();
    match e.url() {
        Some(url) => text.replace(url.as_str(), &clean_url(url)),
        None => text,
    }
}

/// `url` without user info, query or fragment.
fn clean_url(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// The cause under `e`, condensed: the layer that failed (DNS, TLS) and
/// the innermost words. None when `e` has no source.
pub(crate) fn cause(e: &(dyn StdError + 'static)) -> Option<String> {
    let mut dns = false;
    let mut tls: Option<String> = None;
    let mut io_kind = None;
    let mut innermost: Option<String> = None;
    let mut next = e.source();
    // A chain is a handful deep; the bound only guards a cycle.
    for _ in 0..16 {
        let Some(err) = next else { break };
        let text = err.to_string();
        if matches!(text.as_str(), "dns error" | "error resolving DNS") {
            dns = true;
        }
        // An io::Error may wrap another (reqwest's connector wraps
        // tokio-rustls' InvalidData error in an Other), and its `source`
        // skips what it wraps: look inside.
        let mut inside = Some(err);
        for _ in 0..8 {
            let Some(e) = inside else { break };
            if let Some(r) = e.downcast_ref::<rustls::Error>() {
                tls.get_or_insert_with(|| r.to_string());
            }
            let Some(io) = e.downcast_ref::<io::Error>() else {
                break;
            };
            if io.kind() != io::ErrorKind::Other || io_kind.is_none() {
                io_kind = Some(io.kind());
            }
            inside = io.get_ref().map(|i| i as &(dyn StdError + 'static));
        }
        if !is_wrapper(&text) {
            innermost = Some(text);
        }
        next = err.source();
    }
    let words = innermost.map(|t| without_os_error(&t));
    if let Some(t) = tls {
        // What rustls says of a server that answered the hello in plain
        // text, in words that point at the fix.
        let hint = if t.contains("InvalidContentType") {
            " (the server does not seem to speak TLS: is base_url https:// where it should be http://?)"
        } else {
            ""
        };
        return Some(format!("TLS: {t}{hint}"));
    }
    if dns {
        return Some(match words {
            Some(w) => format!("DNS: {w}"),
            None => "DNS: the name did not resolve".into(),
        });
    }
    let by_kind = match io_kind {
        Some(io::ErrorKind::ConnectionRefused) => Some("connection refused"),
        Some(io::ErrorKind::ConnectionReset) => Some("connection reset by the other end"),
        Some(io::ErrorKind::ConnectionAborted) => Some("connection aborted"),
        Some(io::ErrorKind::TimedOut) => Some("timed out"),
        Some(io::ErrorKind::HostUnreachable) => Some("host unreachable"),
        Some(io::ErrorKind::NetworkUnreachable) => Some("network unreachable"),
        Some(io::ErrorKind::AddrNotAvailable) => Some("address not available"),
        _ => None,
    };
    match (by_kind, words) {
        (Some(k), _) => Some(k.to_string()),
        (None, Some(w)) => {
            // A handshake that failed below rustls' own errors (a peer
            // that closed it) still names the layer.
            let lower = w.to_ascii_lowercase();
            if lower.contains("certificate") || lower.contains("handshake") || lower.contains("tls")
            {
                Some(format!("TLS: {w}"))
            } else {
                Some(w)
            }
        }
        (None, None) => None,
    }
}

/// A level of the chain that only says which layer passed the error on.
fn is_wrapper(text: &str) -> bool {
    text.starts_with("client error (")
        || text.starts_with("error sending request")
        || matches!(
            text,
            "dns error" | "error resolving DNS" | "tcp connect error" | "tcp set_nodelay error"
        )
}

/// "Connection refused (os error 111)" -> "Connection refused".
fn without_os_error(text: &str) -> String {
    match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Level(&'static str, Option<Box<dyn StdError + Send + Sync>>);

    impl std::fmt::Display for Level {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Level {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_ref().map(|e| &**e as _)
        }
    }

    fn chain(levels: &[&'static str], last: Box<dyn StdError + Send + Sync>) -> Level {
        let mut inner = last;
        for l in levels.iter().rev() {
            inner = Box::new(Level(l, Some(inner)));
        }
        Level("error sending request for url (http://x/)", Some(inner))
    }

    #[test]
    fn names_the_layer_and_the_innermost_words() {
        let dns = chain(
            &["client error (Connect)", "dns error"],
            Box::new(io::Error::other(
                "failed to lookup address information: Name or service not known",
            )),
        );
        assert_eq!(
            cause(&dns).unwrap(),
            "DNS: failed to lookup address information: Name or service not known"
        );
        let refused = chain(
            &["client error (Connect)", "tcp connect error"],
            Box::new(io::Error::from_raw_os_error(111)),
        );
        assert_eq!(cause(&refused).unwrap(), "connection refused");
        let tls = chain(
            &["client error (Connect)"],
            Box::new(io::Error::new(
                io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
            )),
        );
        assert_eq!(
            cause(&tls).unwrap(),
            "TLS: invalid peer certificate: UnknownIssuer"
        );
        assert_eq!(cause(&Level("alone", None)), None);
        assert_eq!(without_os_error("Broken pipe (os error 32)"), "Broken pipe");
    }

    #[test]
    fn the_url_shown_keeps_no_query_or_user_info() {
        let u = reqwest::Url::parse("https://user:sk-secret@h.example:8443/v1/x?key=AIza123#f")
            .unwrap();
        assert_eq!(clean_url(&u), "https://h.example:8443/v1/x");
    }

    /// Real failures, through reqwest: a refused connect, a name that does
    /// not resolve, and TLS to a server that does not speak it.
    #[tokio::test]
    async fn real_transport_failures_say_what_failed() {
        let client = super::super::http_client().unwrap();
        let said = |r: Result<reqwest::Response, reqwest::Error>| describe(&r.unwrap_err());
        // A port nothing listens on.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let refused = said(
            client
                .get(format!("http://127.0.0.1:{port}/v1/models"))
                .send()
                .await,
        );
        assert!(
            refused.contains("connection refused")
                && refused.contains(&format!("127.0.0.1:{port}")),
            "{refused}"
        );
        let dns = said(
            client
                .get("http://docket-no-such-host.invalid/v1/models?key=AIzaSECRET")
                .send()
                .await,
        );
        assert!(
            dns.contains(": DNS: ") && !dns.contains("AIzaSECRET"),
            "{dns}"
        );
        // A plain TCP server that answers the TLS hello with HTTP.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = plain.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut s, _)) = plain.accept().await {
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            }
        });
        let tls = said(client.get(format!("https://{at}/v1/models")).send().await);
        assert!(tls.contains(": TLS: "), "{tls}");
    }
}
