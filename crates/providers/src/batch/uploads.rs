//! Uploads kept across a create asked again, and which refusals keep
//! them: a rate limit may be retried, the enqueued-token limit is not.

use crate::ProviderError;

/// Uploads kept by tag after a create that made no batch but may be asked
/// again (a rate limit, a timeout, a 5xx): the next `submit` of the same
/// tag with the same bytes reuses the file instead of uploading it again
/// (an upload and a create each take from the provider's request limits);
/// a changed one is deleted, and so is one given up on (`abandon`).
#[derive(Default)]
pub(crate) struct KeptUploads(std::sync::Mutex<std::collections::HashMap<String, (String, u64)>>);

impl KeptUploads {
    /// The upload kept for `tag`: (to reuse, when it has `bytes` bytes; to
    /// delete, when it has not).
    pub(crate) fn take(&self, tag: &str, bytes: u64) -> (Option<String>, Option<String>) {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(tag);
        match kept {
            Some((file, n)) if n == bytes => (Some(file), None),
            Some((file, _)) => (None, Some(file)),
            None => (None, None),
        }
    }

    pub(crate) fn keep(&self, tag: &str, file: String, bytes: u64) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tag.to_string(), (file, bytes));
    }

    pub(crate) fn forget(&self, tag: &str) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(tag)
            .map(|(f, _)| f)
    }
}

/// Whether the upload of a create that failed with `e` is kept (to be
/// reused by the same create asked again, or read by a batch the create
/// may have made after all) rather than deleted at once: a refusal (a 4xx)
/// made no batch and will not be asked again as it was, but a plain rate
/// limit, a timeout, a conflict, a 5xx or no answer will.
pub(crate) fn keep_upload_after(e: &ProviderError) -> bool {
    match e.http_status {
        Some(429) => !is_token_limit(&e.message),
        Some(408 | 409) => true,
        Some(s) => !(400..500).contains(&s),
        None => true,
    }
}

/// Whether a provider's refusal is its enqueued-token limit (OpenAI's and
/// Azure's `token_limit_exceeded`, Anthropic's "queued batch tokens",
/// Gemini's `batch_enqueued_tokens` quota), rather than a request rate.
pub fn is_token_limit(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("token_limit_exceeded")
        || m.contains("enqueued token")
        || m.contains("enqueued_token")
        || m.contains("queued batch tokens")
}
