//! What a soak trial checks once its run has ended: the ledger's invariants,
//! the billing oracle, the session's totals, every item once, no key on
//! record.

use super::*;

/// The session's results on record.
pub(super) fn results_of(ws: &Workspace, sid: &str) -> Result<i64, String> {
    let conn = Connection::open(ws.ledger()).map_err(|e| e.to_string())?;
    count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
        sid,
    )
}

pub(super) fn latest_session(ws: &Workspace) -> Option<String> {
    let conn = docket::ledger::open_read_only(&ws.ledger()).ok()?;
    conn.query_row(
        "SELECT session_id FROM llm_batch_session ORDER BY started_at DESC LIMIT 1",
        [],
        |r| r.get(0),
    )
    .ok()
}

pub(super) fn session_state(ws: &Workspace, sid: &str) -> Option<String> {
    let conn = docket::ledger::open_read_only(&ws.ledger()).ok()?;
    conn.query_row(
        "SELECT state FROM llm_batch_session WHERE session_id = ?1",
        [sid],
        |r| r.get(0),
    )
    .ok()
}

pub(super) fn count(conn: &Connection, sql: &str, sid: &str) -> Result<i64, String> {
    conn.query_row(sql, [sid], |r| r.get(0))
        .map_err(|e| format!("{sql}: {e}"))
}

/// I1, I2, I4 after any run: integrity, foreign keys, at most one result
/// per item, every item of the session on record once, the counters equal
/// to the results.
pub(super) fn check_ledger(ws: &Workspace, sid: &str) -> Result<(), String> {
    let conn = Connection::open(ws.ledger()).map_err(|e| e.to_string())?;
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if ok != "ok" {
        return Err(format!("I4: integrity_check: {ok}"));
    }
    let fk = conn
        .prepare("PRAGMA foreign_key_check")
        .and_then(|mut s| s.query_map([], |_| Ok(())).map(|r| r.count()))
        .map_err(|e| e.to_string())?;
    if fk != 0 {
        return Err(format!("I4: {fk} foreign key violations"));
    }
    let doubled = count(
        &conn,
        "SELECT COUNT(*) FROM (SELECT item_id FROM llm_batch_result WHERE session_id = ?1
           GROUP BY item_id HAVING COUNT(*) > 1)",
        sid,
    )?;
    if doubled != 0 {
        return Err(format!("I2: {doubled} items with two results"));
    }
    let answered_twice = count(
        &conn,
        "SELECT COUNT(*) FROM session_item s WHERE s.session_id = ?1 AND
           (SELECT COUNT(*) FROM llm_messages m WHERE m.request_id = s.request_id
              AND m.state = 'answered') > 1",
        sid,
    )?;
    if answered_twice != 0 {
        return Err(format!(
            "I2: {answered_twice} requests with two answered attempts"
        ));
    }
    let stray = count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result r WHERE r.session_id = ?1 AND NOT EXISTS
           (SELECT 1 FROM session_item s WHERE s.session_id = r.session_id AND s.item_id = r.item_id)",
        sid,
    )?;
    if stray != 0 {
        return Err(format!("I1: {stray} results of no item of the session"));
    }
    let (processed, by_outcome): (i64, i64) = conn
        .query_row(
            "SELECT processed_count, accepted_count + reviewed_count + rejected_count + error_count
             FROM llm_batch_session WHERE session_id = ?1",
            [sid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(|e| e.to_string())?;
    let results = count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
        sid,
    )?;
    if processed != by_outcome || processed != results {
        return Err(format!(
            "counters: processed {processed}, by outcome {by_outcome}, results {results}"
        ));
    }
    Ok(())
}

/// I3 and the billing side of I6, from the mock's log: every request the
/// mock answered was on record before it left (intent before side effect),
/// a request answered n times has at least n-1 ambiguous attempts, and
/// every answer the ledger does not have is an ambiguous attempt. In batch
/// mode: the ledger knows no batch the mock did not create, and at the end
/// the mock ran no line the ledger has no outcome (or ambiguity) for.
pub(super) fn check_oracle(
    mode: Mode,
    mock: &Mock,
    ws: &Workspace,
    report: &mut TrialReport,
    at_end: bool,
) -> Result<(), String> {
    let conn = Connection::open(ws.ledger()).map_err(|e| e.to_string())?;
    report.ambiguous = conn
        .query_row(
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    if mode.batch() {
        return check_batch_oracle(mock, &conn, report, at_end);
    }
    check_sync_oracle(mock, &conn, report, at_end)
}

/// The oracle on a Batch API run: every batch the mock created is one the
/// ledger knows (once), and at the end every line it ran is on record.
fn check_batch_oracle(
    mock: &Mock,
    conn: &Connection,
    report: &mut TrialReport,
    at_end: bool,
) -> Result<(), String> {
    let created = mock.stat("batches_created");
    let known: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM provider_batch WHERE provider_batch_id IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    report.batches_created = created;
    if at_end && created != known as u64 {
        return Err(format!(
            "the mock created {created} batches, the ledger knows {known}: one was made twice or lost"
        ));
    }
    // A create killed before its record is found again by its tag
    // (adopted), never created twice: every batch the provider has is
    // one the ledger knows, once the run that adopts it has run.
    if created < known as u64 {
        return Err(format!(
            "the ledger knows {known} provider batches, the mock created {created}"
        ));
    }
    // Between runs a batch may have run at the provider with its
    // results not yet collected: the lines are compared at the end.
    if !at_end {
        return Ok(());
    }
    let ran = mock.stat("batch_lines_ok") + mock.stat("batch_lines_failed");
    let lines: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM llm_messages WHERE state IN ('answered', 'failed', 'ambiguous')",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    report.billed = ran;
    let unrecorded = ran.saturating_sub(lines as u64);
    report.billed_unrecorded = unrecorded;
    if unrecorded > 0 && unrecorded > report.ambiguous as u64 {
        return Err(format!(
            "I3: the mock ran {ran} lines, the ledger has {lines} and {} ambiguous",
            report.ambiguous
        ));
    }
    check_session_totals(conn)
}

/// The oracle on a synchronous run: every request the mock billed is in
/// the ledger, answered with the tokens billed or marked ambiguous.
fn check_sync_oracle(
    mock: &Mock,
    conn: &Connection,
    report: &mut TrialReport,
    at_end: bool,
) -> Result<(), String> {
    let mut state_of = conn
        .prepare(
            "SELECT state, request_id, input_tokens, output_tokens FROM llm_messages WHERE client_request_id = ?1",
        )
        .map_err(|e| e.to_string())?;
    let mut billed_per_request: HashMap<i64, u64> = HashMap::new();
    let mut billed = 0;
    let mut unrecorded = 0;
    for entry in mock.log() {
        if entry["status"].as_u64() != Some(200) {
            continue;
        }
        let Some(id) = entry["client_request_id"].as_str() else {
            return Err(format!("a billed request without a client id: {entry}"));
        };
        billed += 1;
        type Row = (String, i64, Option<i64>, Option<i64>);
        let (state, request_id, tokens_in, tokens_out): Row = state_of
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(|_| format!("I3: {id} was billed but is not in the ledger"))?;
        let usage = entry["usage"]
            .as_array()
            .map(|u| (u[0].as_i64(), u[1].as_i64()));
        match state.as_str() {
            // I6 per request: what the ledger counts for an answer is what
            // the provider billed for it, token for token.
            "answered" if usage != Some((tokens_in, tokens_out)) => {
                return Err(format!(
                    "I6: {id} billed {usage:?} tokens, the ledger counts ({tokens_in:?}, {tokens_out:?})"
                ));
            }
            "answered" => {}
            // Billed, its answer lost with the process: on record as such.
            "ambiguous" | "sent" => unrecorded += 1,
            other => {
                return Err(format!("I3: {id} was billed but the ledger says {other}"));
            }
        }
        *billed_per_request.entry(request_id).or_default() += 1;
    }
    check_billed_twice(conn, &billed_per_request)?;
    report.billed = billed;
    report.billed_unrecorded = unrecorded;
    if at_end {
        check_session_totals(conn)?;
    }
    Ok(())
}

/// A request billed more than once has an ambiguous attempt for each
/// extra charge (a retry after an answer lost with the process).
fn check_billed_twice(
    conn: &Connection,
    billed_per_request: &HashMap<i64, u64>,
) -> Result<(), String> {
    let mut ambiguous_of = conn
        .prepare(
            "SELECT COUNT(*) FROM llm_messages WHERE request_id = ?1 AND state IN ('ambiguous', 'sent')",
        )
        .map_err(|e| e.to_string())?;
    for (request_id, n) in billed_per_request {
        if *n > 1 {
            let amb: i64 = ambiguous_of
                .query_row([request_id], |r| r.get(0))
                .map_err(|e| e.to_string())?;
            if *n > 1 + amb as u64 {
                return Err(format!(
                    "I3: request {request_id} billed {n} times with {amb} ambiguous attempts"
                ));
            }
        }
    }
    Ok(())
}

/// I6 for the session: its tokens and cost are its answers', each counted
/// once (the billed answers it has no record of are the ambiguous
/// attempts, reported apart as possible duplicate charges).
pub(super) fn check_session_totals(conn: &Connection) -> Result<(), String> {
    let (s_in, s_out, s_cost, m_in, m_out, m_cost): (i64, i64, f64, i64, i64, f64) = conn
        .query_row(
            "SELECT SUM(s.input_tokens), SUM(s.output_tokens), SUM(s.cost_usd),
                    (SELECT COALESCE(SUM(input_tokens), 0) FROM llm_messages WHERE state = 'answered'),
                    (SELECT COALESCE(SUM(output_tokens), 0) FROM llm_messages WHERE state = 'answered'),
                    (SELECT COALESCE(SUM(cost_usd), 0) FROM llm_messages WHERE state = 'answered')
             FROM llm_batch_session s",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
        )
        .map_err(|e| e.to_string())?;
    if (s_in, s_out) != (m_in, m_out) || (s_cost - m_cost).abs() > 1e-9 {
        return Err(format!(
            "I6: the session counts {s_in}/{s_out} tokens and ${s_cost}, its answers {m_in}/{m_out} and ${m_cost}"
        ));
    }
    Ok(())
}

/// I1 and I6 at the end: every item has its one result.
pub(super) fn check_complete(ws: &Workspace, sid: &str, items: usize) -> Result<(), String> {
    let conn = Connection::open(ws.ledger()).map_err(|e| e.to_string())?;
    let (state, total): (String, i64) = conn
        .query_row(
            "SELECT state, total_count FROM llm_batch_session WHERE session_id = ?1",
            [sid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(|e| e.to_string())?;
    let without = count(
        &conn,
        "SELECT COUNT(*) FROM session_item s WHERE s.session_id = ?1 AND
           (SELECT COUNT(*) FROM llm_batch_result r
             WHERE r.session_id = s.session_id AND r.item_id = s.item_id) != 1",
        sid,
    )?;
    if state != "completed" || total != items as i64 || without != 0 {
        return Err(format!(
            "I6: session {state}, {total} of {items} items, {without} without exactly one result"
        ));
    }
    Ok(())
}

/// I5: the key is in no byte of the ledger (its -wal and -shm included),
/// the logs or anything else under HOME.
pub(super) fn check_no_canary(
    ws: &Workspace,
    home: &std::path::Path,
    key: &str,
) -> Result<(), String> {
    let mut files = vec![ws.ledger()];
    files.push(ws.ledger().with_extension("sqlite-wal"));
    files.push(ws.ledger().with_extension("sqlite-shm"));
    let mut stack = vec![home.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    for f in files {
        let Ok(bytes) = std::fs::read(&f) else {
            continue;
        };
        // The round outputs hold docket's own words only; the env var holds
        // the key, never a file.
        if bytes.windows(key.len()).any(|w| w == key.as_bytes()) {
            return Err(format!("I5: the key is in {}", f.display()));
        }
    }
    Ok(())
}
