//! The earlier answers a new plan would find stale: made with another
//! template or parameters (refused before a session starts), or on evidence
//! `docket import --update` replaced since (asked again, and said).
//!
//! Both run at every run's start. A plan of few items (new items on a ledger
//! of a million answers) looks its own items up by the requests' (item_id,
//! ...) index, a chunk at a time, so its start does not grow with the
//! ledger; a large plan reads the answers in one pass, cheaper than a
//! million lookups.

use crate::db::{Connection, ToDb};

/// Up to this many planned items they are looked up; above it, one pass.
const LOOKUP_MAX: usize = 20_000;
/// Planned items per lookup (placeholders per statement, well under
/// SQLite's and PostgreSQL's limits).
const CHUNK: usize = 500;

/// An answered request. Looking items up, the status is no index to use
/// (the unary plus says so; PostgreSQL's SQL drops it): without
/// statistics SQLite would read every answer through it instead of the
/// items' index.
fn answered(lookup: bool) -> &'static str {
    if lookup {
        "+r.status = 'completed'"
    } else {
        "r.status = 'completed'"
    }
}

/// The newest request of its (item, stage, provider, model): an older
/// version's answer is history, not what a plan reuses.
const NEWEST: &str = "r.request_version = (SELECT MAX(v.request_version) FROM llm_requests v
                                    WHERE v.item_id = r.item_id AND v.stage = r.stage
                                      AND v.provider = r.provider AND v.model = r.model)";

/// Answered requests a new session would reuse although they were made with
/// another template or parameters, per stage: (stage, count). Such answers
/// are never reused or sent again silently: the operator chooses
/// (`--rerun-stage`, or restoring the template).
pub(crate) fn stale_answers(
    conn: &Connection,
    stages: &[super::NewStage<'_>],
    item_ids: &[String],
) -> crate::db::Result<Vec<(String, u64)>> {
    stale_answers_with(conn, stages, item_ids, LOOKUP_MAX)
}

fn stale_answers_with(
    conn: &Connection,
    stages: &[super::NewStage<'_>],
    item_ids: &[String],
    lookup_max: usize,
) -> crate::db::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    // The one pass's list, made once for every stage.
    let wanted = (item_ids.len() > lookup_max).then(|| sorted(item_ids));
    for st in stages.iter().filter(|s| !s.rerun) {
        let fixed: [&dyn ToDb; 5] = [
            &st.name,
            &st.provider,
            &st.model,
            &st.template_hash,
            &st.params_hash,
        ];
        let n = match &wanted {
            None => count_by_lookup(conn, &fixed, item_ids, template_lookup)?,
            Some(wanted) => {
                let sql = format!(
                    "SELECT r.item_id FROM llm_requests r WHERE {}",
                    other_template(false)
                );
                count_by_pass(conn, &sql, &fixed, wanted)?
            }
        };
        if n > 0 {
            out.push((st.name.to_string(), n));
        }
    }
    Ok(out)
}

/// How many of the items `ids` (placeholders from ?6) have their newest
/// answer made with another template or parameters (`other_template`).
fn template_lookup(ids: &str) -> String {
    format!(
        "SELECT COUNT(*) FROM llm_requests r WHERE r.item_id IN ({ids}) AND {}",
        other_template(true)
    )
}

/// The newest answer of stage ?1 on provider ?2 and model ?3, made with
/// another template than ?4 or other parameters than ?5.
fn other_template(lookup: bool) -> String {
    format!(
        "r.stage = ?1 AND r.provider = ?2 AND r.model = ?3 AND {}
           AND (r.template_hash != ?4 OR r.params_hash != ?5) AND {NEWEST}",
        answered(lookup)
    )
}

/// Of `item_ids`, how many have an answer made on evidence `docket import
/// --update` replaced since: a new session asks again for them (a new
/// request_version), never silently.
pub(crate) fn count_stale_evidence(
    conn: &Connection,
    item_ids: &[String],
) -> crate::db::Result<u64> {
    count_stale_evidence_with(conn, item_ids, LOOKUP_MAX)
}

fn count_stale_evidence_with(
    conn: &Connection,
    item_ids: &[String],
    lookup_max: usize,
) -> crate::db::Result<u64> {
    if item_ids.len() <= lookup_max {
        return count_by_lookup(conn, &[], item_ids, evidence_lookup);
    }
    // Few rows: the answers on other evidence (the items an update changed).
    let sql = format!(
        "SELECT DISTINCT r.item_id FROM llm_requests r JOIN decision d ON d.item_id = r.item_id
         WHERE {}",
        other_evidence(false)
    );
    count_by_pass(conn, &sql, &[], &sorted(item_ids))
}

/// How many of the items `ids` (placeholders from ?1) have their newest
/// answer made on other evidence (`other_evidence`).
fn evidence_lookup(ids: &str) -> String {
    format!(
        "SELECT COUNT(DISTINCT r.item_id) FROM llm_requests r JOIN decision d ON d.item_id = r.item_id
         WHERE r.item_id IN ({ids}) AND {}",
        other_evidence(true)
    )
}

/// The newest answer `r` made on other evidence than its item `d` has now.
fn other_evidence(lookup: bool) -> String {
    format!(
        "{} AND r.evidence_hash IS NOT NULL AND d.evidence_hash IS NOT NULL
           AND r.evidence_hash != d.evidence_hash AND {NEWEST}",
        answered(lookup)
    )
}

/// The sum of `sql(placeholders)`'s count over `item_ids`, `CHUNK` at a
/// time: `fixed` are its first parameters, the chunk's ids the ones after.
/// `item_ids` are distinct (a plan's), so per-chunk counts add up.
fn count_by_lookup(
    conn: &Connection,
    fixed: &[&dyn ToDb],
    item_ids: &[String],
    sql: impl Fn(&str) -> String,
) -> crate::db::Result<u64> {
    let mut total = 0u64;
    for chunk in item_ids.chunks(CHUNK) {
        let first = fixed.len() + 1;
        let placeholders: Vec<String> = (first..first + chunk.len())
            .map(|i| format!("?{i}"))
            .collect();
        let mut values: Vec<&dyn ToDb> = fixed.to_vec();
        values.extend(chunk.iter().map(|id| id as &dyn ToDb));
        let n: i64 = conn
            .prepare_cached(&sql(&placeholders.join(",")))?
            .query_row(&values, |r| r.get(0))?;
        total += u64::try_from(n).unwrap_or(0);
    }
    Ok(total)
}

/// The plan's ids sorted, for the one pass to look up. A sorted list, not
/// a hash set: half the memory (16 bytes an id against about 36), and this
/// runs as a million-item run starts, at its peak.
fn sorted(item_ids: &[String]) -> Vec<&str> {
    let mut wanted: Vec<&str> = item_ids.iter().map(String::as_str).collect();
    wanted.sort_unstable();
    wanted
}

/// How many of the item ids `sql` gives (one pass) are among `wanted`
/// (sorted: `sorted`).
fn count_by_pass(
    conn: &Connection,
    sql: &str,
    values: &[&dyn ToDb],
    wanted: &[&str],
) -> crate::db::Result<u64> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(values)?;
    let mut n = 0u64;
    while let Some(r) = rows.next()? {
        let item: String = r.get(0)?;
        if wanted.binary_search(&item.as_str()).is_ok() {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::params;
    use crate::store::NewStage;

    /// A ledger of `items` answered for stage "adjudicate" (template "t",
    /// parameters "p", evidence "e"), then: every third answered with
    /// template "old", every fifth on evidence "was", and item 0's newest
    /// version a fresh one on other evidence with its old version stale.
    fn ledger(items: usize) -> (tempfile::TempDir, Connection, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::Sqlite(crate::open(&dir.path().join("l.sqlite")).unwrap());
        let ids: Vec<String> = (0..items).map(|i| format!("item-{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            conn.execute(
                "INSERT INTO decision (item_id, evidence_json, imported_at, updated_at, evidence_hash)
                 VALUES (?1, '{}', 0, 0, 'e')",
                params![id],
            )
            .unwrap();
            let template = if i % 3 == 0 { "old" } else { "t" };
            let evidence = if i % 5 == 0 { "was" } else { "e" };
            conn.execute(
                "INSERT INTO llm_requests (item_id, stage, provider, model, request_version, status,
                     template_hash, params_hash, evidence_hash, created_at, updated_at)
                 VALUES (?1, 'adjudicate', 'main', 'm', 1, 'completed', ?2, 'p', ?3, 0, 0)",
                params![id, template, evidence],
            )
            .unwrap();
        }
        // Item 0 asked again since: its newest version is pending.
        conn.execute(
            "INSERT INTO llm_requests (item_id, stage, provider, model, request_version, status,
                 template_hash, params_hash, evidence_hash, created_at, updated_at)
             VALUES ('item-0', 'adjudicate', 'main', 'm', 2, 'pending', 't', 'p', 'e', 0, 0)",
            params![],
        )
        .unwrap();
        (dir, conn, ids)
    }

    /// Both ways (lookups, one pass) count alike, over more than a chunk,
    /// for the whole plan and for part of it; an older version is history.
    #[test]
    fn lookups_and_one_pass_count_alike() {
        let (_dir, conn, ids) = ledger(1_234);
        let stages = [NewStage::for_test("adjudicate", None)];
        // Every third from 3 (item 0's newest is not answered), and every
        // fifth from 5.
        let stale_template = (1_234 - 1) / 3;
        let stale_evidence = (1_234 - 1) / 5;
        let part = &ids[..700];
        for lookup_max in [0, usize::MAX] {
            let answers = stale_answers_with(&conn, &stages, &ids, lookup_max).unwrap();
            assert_eq!(
                answers,
                [("adjudicate".to_string(), stale_template as u64)],
                "lookup_max {lookup_max}"
            );
            let answers = stale_answers_with(&conn, &stages, part, lookup_max).unwrap();
            assert_eq!(answers, [("adjudicate".to_string(), 699 / 3)]);
            let evidence = count_stale_evidence_with(&conn, &ids, lookup_max).unwrap();
            assert_eq!(evidence, stale_evidence as u64, "lookup_max {lookup_max}");
            let evidence = count_stale_evidence_with(&conn, part, lookup_max).unwrap();
            assert_eq!(evidence, 699 / 5);
            let none = count_stale_evidence_with(&conn, &[], lookup_max).unwrap();
            assert_eq!(none, 0);
        }
    }

    /// Looking items up goes through the items' index, never through the
    /// status index over every answer (what SQLite chose before the
    /// unary plus: a lookup then cost a pass).
    #[test]
    fn a_lookup_reads_its_items_not_every_answer() {
        let (_dir, conn, _) = ledger(10);
        // The statements the lookups run, every parameter bound to a string.
        let plan = |sql: String| -> String {
            let Connection::Sqlite(c) = &conn else {
                unreachable!()
            };
            let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let values = vec!["x"; stmt.parameter_count()];
            let rows = stmt
                .query_map(rusqlite::params_from_iter(values), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap();
            rows.map(Result::unwrap).collect::<Vec<_>>().join("\n")
        };
        for sql in [template_lookup("?6, ?7"), evidence_lookup("?1, ?2")] {
            let plan = plan(sql);
            assert!(
                plan.contains("sqlite_autoindex_llm_requests_1 (item_id=?"),
                "{plan}"
            );
            assert!(!plan.contains("idx_llm_requests_status"), "{plan}");
        }
    }
}
