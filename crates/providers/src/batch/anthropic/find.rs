//! Finding a batch whose create answer was lost: Anthropic keeps no
//! metadata, so the candidates are the batches of the window with the
//! same request count.

use serde::Deserialize;

use super::poll::{MessageBatch, RequestCounts, unix_of};
use super::{AnthropicBatch, CALL_TIMEOUT, MAX_LIST_PAGES, parse_json};
use crate::ProviderError;
use crate::batch::http::request_error;
use crate::batch::{FIND_CLOCK_MARGIN, Found, verdict};

impl AnthropicBatch {
    /// `_tag` cannot be checked: Anthropic keeps no metadata on a batch, so
    /// the window and the request count are all there is to match on.
    pub(super) async fn find_inner(
        &self,
        _tag: &str,
        created_after: f64,
        request_count: usize,
    ) -> Result<Found, ProviderError> {
        // A wider window is the safe side: at worst more Ambiguous.
        let since = created_after - FIND_CLOCK_MARGIN;
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut url = self.url("?limit=100");
            if let Some(a) = &after {
                url.push_str("&after_id=");
                url.push_str(&crate::path_segment(a));
            }
            let raw = self
                .call(self.client.get(url).timeout(CALL_TIMEOUT))
                .await?;
            let page: ListPage = parse_json(&raw, "batch list")?;
            page.matches(since, request_count, &mut found);
            // Newest first: once the page's last batch is older than the
            // window, so is everything after it.
            let last = page.data.last();
            let older = last
                .and_then(|b| unix_of(b.created_at.as_deref()))
                .is_some_and(|t| t < since);
            if older || !page.has_more || last.is_none() {
                return Ok(verdict(found, Vec::new(), Vec::new()));
            }
            after = page.last_id.clone().or_else(|| last.map(|b| b.id.clone()));
        }
        Err(request_error(format!(
            "listed {} message batches without reaching the submission time; cannot tell whether the batch was created",
            MAX_LIST_PAGES * 100
        )))
    }
}

#[derive(Deserialize)]
pub(super) struct ListPage {
    #[serde(default)]
    pub(super) data: Vec<MessageBatch>,
    #[serde(default)]
    pub(super) last_id: Option<String>,
    #[serde(default)]
    pub(super) has_more: bool,
}

impl ListPage {
    /// Batches on this page created at or after `created_after` with
    /// `request_count` requests. A batch without a readable `created_at`
    /// is kept: it cannot be ruled out.
    pub(super) fn matches(
        &self,
        created_after: f64,
        request_count: usize,
        found: &mut Vec<String>,
    ) {
        for b in &self.data {
            if unix_of(b.created_at.as_deref()).is_some_and(|t| t < created_after) {
                continue;
            }
            let total = b.request_counts.as_ref().map_or(0, RequestCounts::total);
            if total == request_count as u64 {
                found.push(b.id.clone());
            }
        }
    }
}
