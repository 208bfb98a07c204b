//! Finding a batch whose create answer was lost: every page of the batch
//! list, matched by display name (docket's tag) and request count.

use serde_json::Value;

use super::operation::{OpView, field, int64, op_name};
use super::{CALL_TIMEOUT, GeminiBatch, MAX_LIST_PAGES, parse_json};
use crate::ProviderError;
use crate::batch::http::request_error;
use crate::batch::{FIND_CLOCK_MARGIN, Found};

impl GeminiBatch {
    pub(super) async fn find_inner(
        &self,
        tag: &str,
        created_after: f64,
        request_count: usize,
    ) -> Result<Found, ProviderError> {
        let since = created_after - FIND_CLOCK_MARGIN;
        let (mut exact, mut tag_only) = (Vec::new(), Vec::new());
        let mut token: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut url = format!("{}/v1beta/batches?pageSize=100", self.base);
            if let Some(t) = &token {
                url.push_str("&pageToken=");
                url.push_str(&crate::path_segment(t));
            }
            let raw = self
                .call(self.client.get(url).timeout(CALL_TIMEOUT))
                .await?;
            let page: Value = parse_json(&raw, "batch list")?;
            let ops = page
                .get("operations")
                .or_else(|| page.get("batches"))
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            matches(ops, tag, since, request_count, &mut exact, &mut tag_only);
            token = page
                .get("nextPageToken")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                return Ok(verdict(exact, tag_only));
            }
        }
        Err(request_error(format!(
            "listed {MAX_LIST_PAGES} pages of batches without reaching the end; \
             cannot tell whether {tag:?} was created"
        )))
    }
}

/// Batches of a list page named `tag` (created at or after `created_after`
/// when their `createTime` says): with `request_count` requests (or no
/// count yet) into `exact`, with another count into `tag_only`.
pub(super) fn matches(
    ops: &[Value],
    tag: &str,
    created_after: f64,
    request_count: usize,
    exact: &mut Vec<String>,
    tag_only: &mut Vec<String>,
) {
    for op in ops {
        let o = OpView::new(op);
        if field(o.batch, &["displayName", "display_name"]).and_then(Value::as_str) != Some(tag) {
            continue;
        }
        let created = field(o.batch, &["createTime", "create_time"])
            .and_then(Value::as_str)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_micros() as f64 / 1e6);
        if created.is_some_and(|t| t < created_after) {
            continue;
        }
        let Some(name) = op_name(op) else { continue };
        let count = field(o.batch, &["batchStats", "batch_stats"])
            .and_then(|s| field(s, &["requestCount", "request_count"]));
        if count.is_none() || int64(count) == request_count as u64 {
            exact.push(name);
        } else {
            tag_only.push(name);
        }
    }
}

/// One exact match is ours; none at all is safe to submit; anything else
/// cannot be told apart.
pub(super) fn verdict(exact: Vec<String>, tag_only: Vec<String>) -> Found {
    crate::batch::verdict(exact, tag_only, Vec::new())
}
