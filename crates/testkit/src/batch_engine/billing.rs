//! The ledger's side of a batch run and the billing oracle: every line the
//! provider billed is on record, nothing answered twice.

use super::*;

/// One provider_batch row.
#[derive(Debug, Clone)]
pub struct BatchRow {
    pub batch_id: i64,
    pub state: String,
    pub provider_batch_id: Option<String>,
    pub request_count: i64,
    pub completed_count: i64,
    pub failed_count: i64,
    pub ingested_count: i64,
    pub quarantined_count: i64,
}

/// The session's provider batches, oldest first.
pub fn batch_rows(conn: &Connection, sid: &str) -> Vec<BatchRow> {
    conn.prepare(
        "SELECT batch_id, state, provider_batch_id, request_count, completed_count, failed_count,
                ingested_count, quarantined_count
         FROM provider_batch WHERE session_id = ?1 ORDER BY batch_id",
    )
    .unwrap()
    .query_map([sid], |r| {
        Ok(BatchRow {
            batch_id: r.get(0)?,
            state: r.get(1)?,
            provider_batch_id: r.get(2)?,
            request_count: r.get(3)?,
            completed_count: r.get(4)?,
            failed_count: r.get(5)?,
            ingested_count: r.get(6)?,
            quarantined_count: r.get(7)?,
        })
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// One batch line as the ledger recorded it: its attempt's message.
#[derive(Debug, Clone)]
pub struct LineRow {
    pub batch_id: i64,
    pub custom_id: String,
    pub request_id: i64,
    pub attempt: i64,
    pub state: String,
    pub error_kind: Option<String>,
    pub error_message: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cached_input_tokens: Option<i64>,
    pub cost_usd: Option<f64>,
}

/// Every batch line in the ledger with its message, by custom_id.
pub fn line_rows(conn: &Connection) -> HashMap<String, LineRow> {
    let rows: Vec<LineRow> = conn
        .prepare(
            "SELECT i.batch_id, i.custom_id, i.request_id, i.attempt, m.state, m.error_kind,
                    m.error_message, m.input_tokens, m.output_tokens, m.cached_input_tokens,
                    m.cost_usd
             FROM provider_batch_item i JOIN llm_messages m
               ON m.request_id = i.request_id AND m.attempt = i.attempt",
        )
        .unwrap()
        .query_map([], |r| {
            Ok(LineRow {
                batch_id: r.get(0)?,
                custom_id: r.get(1)?,
                request_id: r.get(2)?,
                attempt: r.get(3)?,
                state: r.get(4)?,
                error_kind: r.get(5)?,
                error_message: r.get(6)?,
                input_tokens: r.get(7)?,
                output_tokens: r.get(8)?,
                cached_input_tokens: r.get(9)?,
                cost_usd: r.get(10)?,
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let n = rows.len();
    let by_id: HashMap<String, LineRow> =
        rows.into_iter().map(|r| (r.custom_id.clone(), r)).collect();
    assert_eq!(by_id.len(), n, "a custom_id on two batch lines");
    by_id
}

/// Every one of the `n` items has exactly one result.
pub fn each_item_once(conn: &Connection, sid: &str, n: i64) {
    let results = count(
        conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
        [sid],
    );
    let distinct = count(
        conn,
        "SELECT COUNT(DISTINCT item_id) FROM llm_batch_result WHERE session_id = ?1",
        [sid],
    );
    assert_eq!((results, distinct), (n, n), "results, items with a result");
}

/// No request was answered twice.
pub fn no_double_answers(conn: &Connection) {
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered'
                GROUP BY request_id HAVING COUNT(*) > 1)",
            []
        ),
        "a request with two answered messages"
    );
}

/// What the billing oracle found.
#[derive(Debug, Default)]
pub struct Billing {
    /// Lines the mock billed (status 200 in its billing log).
    pub billed: HashSet<String>,
    /// Of those, the ones the ledger has as ambiguous: billed, but no
    /// result line ever came for them.
    pub ambiguous: HashSet<String>,
    /// Per provider batch: what it served.
    pub served: HashMap<String, Served>,
    /// The ledger's cost of the answered lines, and the oracle's.
    pub ledger_cost: f64,
    pub oracle_cost: f64,
}

/// The billing oracle, at the end of a run: the mock ran each custom_id at
/// most once and billed it at most once; every billed line is in the ledger,
/// answered with the tokens of its first result line as served (and so their
/// batch price), or ambiguous when the provider served no line for it; the
/// ledger has no answer the mock did not bill, and no line it never ran as
/// billed. OpenAI's own token count of a batch equals the ledger's when
/// every billed line of it was answered.
pub async fn check_billing(m: &MockServer, wire: Wire, conn: &Connection, sid: &str) -> Billing {
    let billed = billed_once(m);
    let lines = line_rows(conn);
    let mut out = Billing {
        billed,
        ..Default::default()
    };
    for b in batch_rows(conn, sid) {
        let Some(pid) = b.provider_batch_id else {
            continue;
        };
        let s = served(m, wire, &pid).await;
        out.served.insert(pid, s);
    }
    let usage_of = |id: &str| out.served.values().find_map(|s| s.usage.get(id).copied());
    let served_at_all = |id: &str| out.served.values().any(|s| s.lines.contains_key(id));
    let (price, known) = docket::cost::price_of(wire.model());
    assert!(known, "{} has a price", wire.model());
    for id in &out.billed {
        let row = lines
            .get(id)
            .unwrap_or_else(|| panic!("{id} was billed but the ledger has no such line"));
        match row.state.as_str() {
            "answered" => {
                let (input, output) =
                    usage_of(id).unwrap_or_else(|| panic!("{id}: answered with no result line"));
                assert_eq!(
                    (row.input_tokens, row.output_tokens),
                    (Some(input as i64), Some(output as i64)),
                    "{id}: the ledger's tokens against its first result line"
                );
                let cached = row.cached_input_tokens.unwrap_or(0).max(0) as u64;
                let oracle =
                    price.cost(input, cached, output) * docket::provider::batch::BATCH_PRICE_FACTOR;
                let cost = row.cost_usd.unwrap_or(0.0);
                assert!(
                    (cost - oracle).abs() <= 1e-12 + oracle * 1e-9,
                    "{id}: the ledger's cost {cost} against the oracle's {oracle}"
                );
                out.ledger_cost += cost;
                out.oracle_cost += oracle;
            }
            "ambiguous" => {
                assert!(
                    !served_at_all(id),
                    "{id}: ambiguous, though the provider served a line for it"
                );
                out.ambiguous.insert(id.clone());
            }
            other => panic!("{id} was billed but the ledger says {other}: {row:?}"),
        }
    }
    check_never_billed(&lines, &out.billed);
    if wire == Wire::OpenAi {
        check_batch_usage(conn, sid, &lines, &out.served);
    }
    assert!(
        (out.ledger_cost - out.oracle_cost).abs() <= 1e-9 * out.oracle_cost.max(1e-9),
        "ledger {} oracle {}",
        out.ledger_cost,
        out.oracle_cost
    );
    out
}

/// The custom ids the mock billed, each run or closed once.
fn billed_once(m: &MockServer) -> HashSet<String> {
    let log = line_log(m);
    assert!(
        !log.is_empty(),
        "the billing log is empty: batch_line_log off?"
    );
    let mut runs: HashMap<&str, usize> = HashMap::new();
    for e in &log {
        *runs.entry(e.custom_id.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "lines run or closed twice: {twice:?}");
    log.iter()
        .filter(|e| e.status == 200)
        .map(|e| e.custom_id.clone())
        .collect()
}

/// An answer the ledger has was billed; a line it says never ran was not,
/// and cost nothing.
fn check_never_billed(lines: &HashMap<String, LineRow>, billed: &HashSet<String>) {
    for row in lines.values() {
        if row.state == "answered" {
            assert!(
                billed.contains(&row.custom_id),
                "{}: answered in the ledger, never billed",
                row.custom_id
            );
        }
        if row.error_kind.as_deref() == Some("not_run") {
            assert!(
                !billed.contains(&row.custom_id),
                "{}: billed, but the ledger says it never ran",
                row.custom_id
            );
            assert_eq!(row.cost_usd.unwrap_or(0.0), 0.0, "{row:?}");
        }
    }
}

/// OpenAI's batch usage: the tokens the ledger counts for a batch's
/// answers are the provider's total for it (unless a line is ambiguous).
fn check_batch_usage(
    conn: &Connection,
    sid: &str,
    lines: &HashMap<String, LineRow>,
    served: &HashMap<String, Served>,
) {
    for b in batch_rows(conn, sid) {
        let Some(pid) = &b.provider_batch_id else {
            continue;
        };
        let Some(total) = served[pid].batch_usage else {
            continue;
        };
        let of_batch: Vec<&LineRow> = lines
            .values()
            .filter(|l| l.batch_id == b.batch_id)
            .collect();
        if of_batch.iter().any(|l| l.state == "ambiguous") {
            continue;
        }
        let sum =
            of_batch
                .iter()
                .filter(|l| l.state == "answered")
                .fold((0u64, 0u64), |(i, o), l| {
                    (
                        i + l.input_tokens.unwrap_or(0) as u64,
                        o + l.output_tokens.unwrap_or(0) as u64,
                    )
                });
        assert_eq!(
            sum, total,
            "batch {pid}: the ledger's tokens against the provider's usage"
        );
    }
}

/// Ids of `rows` in `batch_id` whose message is in `state` (and, when
/// given, of `kind`).
pub fn ids_in(
    rows: &HashMap<String, LineRow>,
    batch_id: i64,
    state: &str,
    kind: Option<&str>,
) -> HashSet<String> {
    rows.values()
        .filter(|l| l.batch_id == batch_id && l.state == state)
        .filter(|l| kind.is_none() || l.error_kind.as_deref() == kind)
        .map(|l| l.custom_id.clone())
        .collect()
}

/// The request of line `id` was answered by a later attempt, in another
/// batch.
pub fn answered_later(rows: &HashMap<String, LineRow>, id: &str) -> bool {
    let l = &rows[id];
    rows.values().any(|o| {
        o.request_id == l.request_id
            && o.attempt > l.attempt
            && o.batch_id != l.batch_id
            && o.state == "answered"
    })
}
