//! Finding a batch whose create answer was lost: the batch list, newest
//! first, matched by docket's tag and request count in its metadata.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::poll::BatchObject;
use super::{
    CALL_TIMEOUT, Flavour, MAX_LIST_PAGES, OpenAiBatch, REQUESTS_KEY, TAG_KEY, null_as_default,
    parse_json,
};
use crate::ProviderError;
use crate::batch::http::request_error;
use crate::batch::{FIND_CLOCK_MARGIN, Found, verdict};

impl OpenAiBatch {
    pub(super) async fn find_inner(
        &self,
        tag: &str,
        created_after: f64,
        request_count: usize,
    ) -> Result<Found, ProviderError> {
        let since = created_after - FIND_CLOCK_MARGIN;
        let azure = matches!(self.flavour, Flavour::Azure { .. });
        let (mut exact, mut tag_only, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
        let mut after: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut query = vec![("limit", "100")];
            if let Some(a) = &after {
                query.push(("after", a.as_str()));
            }
            let raw = self
                .call(
                    self.client
                        .get(self.url("batches", &query))
                        .timeout(CALL_TIMEOUT),
                )
                .await?;
            let page: ListObject = parse_json(&raw, "batch list")?;
            page.matches(tag, since, request_count, &mut exact, &mut tag_only);
            if azure {
                page.without_metadata(since, &mut unknown);
            }
            // Listed newest first: once the page's last batch is older than
            // the window, so is everything after it.
            let last = page.data.last();
            let older = last.and_then(|b| b.created_at).is_some_and(|t| t < since);
            if older || !page.has_more || last.is_none() {
                return Ok(verdict(exact, tag_only, unknown));
            }
            after = page.last_id.clone().or_else(|| last.map(|b| b.id.clone()));
        }
        Err(request_error(format!(
            "listed {} batches without reaching the submission time; cannot tell whether {tag:?} was created",
            MAX_LIST_PAGES * 100
        )))
    }
}

#[derive(Deserialize)]
pub(super) struct ListObject {
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) data: Vec<BatchObject>,
    #[serde(default)]
    pub(super) last_id: Option<String>,
    #[serde(default)]
    pub(super) has_more: bool,
}

impl ListObject {
    /// Batches on this page created for `tag` at or after `created_after`:
    /// with `request_count` requests into `exact`, with another count (or
    /// none) into `tag_only`.
    pub(super) fn matches(
        &self,
        tag: &str,
        created_after: f64,
        request_count: usize,
        exact: &mut Vec<String>,
        tag_only: &mut Vec<String>,
    ) {
        for b in &self.data {
            if b.created_at.is_some_and(|t| t < created_after) {
                continue;
            }
            let meta = b.metadata.as_ref();
            if meta.and_then(|m| m.get(TAG_KEY)).and_then(Value::as_str) != Some(tag) {
                continue;
            }
            let count_matches = match meta.and_then(|m| m.get(REQUESTS_KEY)) {
                Some(Value::String(s)) => s.trim().parse::<usize>().ok() == Some(request_count),
                Some(Value::Number(n)) => n.as_u64() == Some(request_count as u64),
                _ => false,
            };
            if count_matches {
                exact.push(b.id.clone());
            } else {
                tag_only.push(b.id.clone());
            }
        }
    }

    /// Batches on this page at or after `created_after` with no metadata at
    /// all (missing, null or empty): whether one is ours cannot be checked.
    pub(super) fn without_metadata(&self, created_after: f64, unknown: &mut Vec<String>) {
        for b in &self.data {
            if b.created_at.is_some_and(|t| t < created_after) {
                continue;
            }
            if b.metadata.as_ref().is_none_or(Map::is_empty) {
                unknown.push(b.id.clone());
            }
        }
    }
}
