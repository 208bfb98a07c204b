//! Planning a session: its row, stages, items and requests in one
//! transaction.

use super::candidates::live_cutoff;
use super::sessions::hostname;
use crate::db::{Connection, OptionalExtension, TransactionBehavior, params};

/// A stage of a new session's job.
pub struct NewStage<'a> {
    pub name: &'a str,
    pub provider: &'a str,
    pub model: &'a str,
    pub template_hash: &'a str,
    pub params_hash: &'a str,
    pub critic_of: Option<&'a str>,
    /// `--rerun-stage` reached this stage: new requests (a new
    /// request_version) instead of the answered ones.
    pub rerun: bool,
}

#[cfg(test)]
impl NewStage<'static> {
    /// A stage of a test job: provider "main", model "m", template hash
    /// "t", parameters hash "p", not rerun.
    pub(crate) const fn for_test(name: &'static str, critic_of: Option<&'static str>) -> Self {
        NewStage {
            name,
            provider: "main",
            model: "m",
            template_hash: "t",
            params_hash: "p",
            critic_of,
            rerun: false,
        }
    }
}

/// What a new session is created with.
pub struct NewSession<'a> {
    pub session_id: &'a str,
    pub config_snapshot_json: &'a str,
    /// In job order; the first is the one `session_item` links.
    pub stages: &'a [NewStage<'a>],
    pub estimated_tokens: u64,
    pub estimated_cost_usd: f64,
    pub max_cost_usd: Option<f64>,
    pub item_ids: &'a [String],
    /// The rate-limit profile (name, version) the run takes its limits
    /// from, written with the session row so no session is ever seen
    /// without the profile it ran with.
    pub profile: Option<(&'a str, i64)>,
}

/// Create the session, its requests for every stage (reusing answered ones
/// made with the same template and parameters; `rerun` stages get a new
/// request_version), its item list and stage checkpoints, in one
/// transaction. Returns how many items it took: the planned items are
/// checked again under the write lock, and any that a live session took or
/// any session decided since the plan was read (two sessions started at the
/// same instant) are left out, so choosing and claiming are one atomic
/// step. With none left nothing is created.
pub(crate) fn create_session(
    conn: &mut Connection,
    s: &NewSession<'_>,
) -> crate::db::Result<usize> {
    let now = conn.now()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let item_ids = still_free(&tx, s.item_ids)?;
    // Every planned item taken meanwhile (a plan of none still makes its
    // empty session).
    if item_ids.is_empty() && !s.item_ids.is_empty() {
        tx.rollback()?;
        return Ok(0);
    }
    tx.execute(
        "INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, state, desired_state,
             estimated_tokens, estimated_cost_usd, max_cost_usd, owner_pid, owner_host, heartbeat_at, updated_at,
             profile_name, profile_version)
         VALUES (?1, ?2, ?3, ?4, 'running', 'running', ?5, ?6, ?7, ?8, ?9, ?2, ?2, ?10, ?11)",
        params![
            s.session_id,
            now,
            item_ids.len() as i64,
            s.config_snapshot_json,
            s.estimated_tokens as i64,
            s.estimated_cost_usd,
            s.max_cost_usd,
            std::process::id(),
            hostname(),
            s.profile.map(|p| p.0),
            s.profile.map(|p| p.1)
        ],
    )?;
    {
        let mut link = tx.prepare(
            "INSERT INTO session_item (session_id, position, item_id, request_id) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut stage_row = tx.prepare(
            "INSERT INTO session_request (session_id, item_id, stage, position, request_id, state, output_json, updated_at)
             SELECT ?1, ?2, ?3, ?4, request_id, 'pending', NULL, ?5 FROM llm_requests WHERE request_id = ?6",
        )?;
        for (pos, st) in s.stages.iter().enumerate() {
            tx.execute(
                "INSERT INTO run_stages (session_id, stage, position, role, critic_of, total, state, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7)",
                params![
                    s.session_id,
                    st.name,
                    pos as i64,
                    if st.critic_of.is_some() { "critic" } else { "generator" },
                    st.critic_of,
                    item_ids.len() as i64,
                    now
                ],
            )?;
        }
        for (pos, item_id) in item_ids.iter().enumerate() {
            // A stage after one that is asked anew is asked anew too: its
            // answer was made from the earlier stage's old output (a critic
            // judged an answer that is being replaced).
            let mut earlier_anew = false;
            for (si, st) in s.stages.iter().enumerate() {
                let (request_id, reused) = request_for(&tx, item_id, st, earlier_anew, now)?;
                earlier_anew |= !reused;
                if si == 0 {
                    link.execute(params![s.session_id, pos as i64, item_id, request_id])?;
                }
                stage_row.execute(params![
                    s.session_id,
                    item_id,
                    st.name,
                    si as i64,
                    now,
                    request_id
                ])?;
            }
        }
    }
    tx.commit()?;
    Ok(item_ids.len())
}

/// The planned items a new session may still take, checked again under
/// the write lock: still undecided (a session that ran meanwhile may have
/// decided some: asking again would pay twice), and held by no live
/// session.
fn still_free<'a>(conn: &Connection, item_ids: &'a [String]) -> crate::db::Result<Vec<&'a String>> {
    let cutoff = live_cutoff(conn)?;
    let mut undecided = conn
        .prepare_cached("SELECT 1 FROM decision WHERE item_id = ?1 AND state = 'indeterminate'")?;
    let mut held = conn.prepare_cached(
        "SELECT 1 FROM session_item si JOIN llm_batch_session s ON s.session_id = si.session_id
         WHERE si.item_id = ?1 AND s.state IN ('running', 'paused') AND s.heartbeat_at >= ?2
           AND NOT EXISTS (SELECT 1 FROM llm_batch_result b WHERE b.session_id = si.session_id AND b.item_id = si.item_id)
         LIMIT 1",
    )?;
    let mut kept = Vec::with_capacity(item_ids.len());
    for id in item_ids {
        let free = undecided.exists(params![id])?
            && match cutoff {
                Some(cutoff) => !held.exists(params![id, cutoff])?,
                None => true,
            };
        if free {
            kept.push(id);
        }
    }
    Ok(kept)
}

/// The request a new session uses for (item, stage): the newest version,
/// reused as it is when answered on the item's evidence as it is now
/// (stale answers were refused before, see `stale_answers`), made afresh
/// when it never was; a new version when the stage is rerun, when an
/// earlier stage of the item is asked anew (`earlier_anew`: this answer was
/// made from its old output), or when the answer was made on evidence
/// `docket import --update` replaced since. Also whether the request is an
/// answer reused as it is.
fn request_for(
    conn: &Connection,
    item_id: &str,
    st: &NewStage<'_>,
    earlier_anew: bool,
    now: f64,
) -> crate::db::Result<(i64, bool)> {
    // An answer is reused only when nothing it was made from is asked anew.
    let rerun = st.rerun || earlier_anew;
    type Newest = (i64, i64, String, Option<String>, Option<String>);
    let newest: Option<Newest> = conn
        .prepare_cached(
            "SELECT r.request_id, r.request_version, r.status, r.evidence_hash, d.evidence_hash
             FROM llm_requests r JOIN decision d ON d.item_id = r.item_id
             WHERE r.item_id = ?1 AND r.stage = ?2 AND r.provider = ?3 AND r.model = ?4
             ORDER BY r.request_version DESC LIMIT 1",
        )?
        .query_row(params![item_id, st.name, st.provider, st.model], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .optional()?;
    match newest {
        Some((id, _, status, asked_on, now_hash))
            if !rerun
                && status == "completed"
                && !crate::import::other_evidence(&asked_on, &now_hash) =>
        {
            Ok((id, true))
        }
        Some((id, _, status, _, _)) if !st.rerun && status != "completed" => {
            // Never answered: fresh budgets, today's template, parameters
            // and evidence.
            conn.prepare_cached(
                "UPDATE llm_requests SET status = 'pending', parsed_output_json = NULL, result_message_id = NULL,
                     gate_failures = 0, transport_retries = 0, template_hash = ?2, params_hash = ?3, updated_at = ?4,
                     evidence_hash = (SELECT evidence_hash FROM decision WHERE item_id = ?5)
                 WHERE request_id = ?1",
            )?
            .execute(params![id, st.template_hash, st.params_hash, now, item_id])?;
            Ok((id, false))
        }
        newest => {
            let version = newest.map_or(1, |n| n.1 + 1);
            conn.prepare_cached(
                "INSERT INTO llm_requests (item_id, stage, provider, model, request_version, status, template_hash, params_hash,
                     created_at, updated_at, evidence_hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?8, (SELECT evidence_hash FROM decision WHERE item_id = ?1))
                 RETURNING request_id",
            )?
            .query_row(
                params![item_id, st.name, st.provider, st.model, version, st.template_hash, st.params_hash, now],
                |r| r.get(0),
            )
            .map(|id| (id, false))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAGES: [NewStage<'static>; 2] = [
        NewStage::for_test("adjudicate", None),
        NewStage::for_test("critic", Some("adjudicate")),
    ];

    fn session(conn: &mut Connection, id: &str, items: &[String]) {
        let taken = create_session(
            conn,
            &NewSession {
                session_id: id,
                config_snapshot_json: "{}",
                stages: &STAGES,
                estimated_tokens: 0,
                estimated_cost_usd: 0.0,
                max_cost_usd: None,
                item_ids: items,
                profile: None,
            },
        )
        .unwrap();
        assert_eq!(taken, items.len());
    }

    /// (request_id, request_version) of each stage of `item` in `session`.
    fn requests(conn: &Connection, session: &str, item: &str) -> Vec<(i64, i64)> {
        let mut stmt = conn
            .prepare(
                "SELECT r.request_id, r.request_version FROM session_request sr
                 JOIN llm_requests r ON r.request_id = sr.request_id
                 WHERE sr.session_id = ?1 AND sr.item_id = ?2 ORDER BY sr.position",
            )
            .unwrap();
        let rows = stmt
            .query_map(params![session, item], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        rows.map(Result::unwrap).collect()
    }

    /// Item "a" had its evidence replaced after its generator answered and
    /// before its critic was sent (the session waited): the next session
    /// asks its generator again, and its critic too, though the critic's
    /// answer records the evidence as it is now (it judged the old answer).
    /// Item "b", answered on the evidence it has, reuses both answers.
    #[test]
    fn a_stage_after_one_asked_anew_is_asked_anew() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::Sqlite(crate::open(&dir.path().join("l.sqlite")).unwrap());
        let items = vec!["a".to_string(), "b".to_string()];
        for id in &items {
            conn.execute(
                "INSERT INTO decision (item_id, evidence_json, imported_at, updated_at, evidence_hash)
                 VALUES (?1, '{}', 0, 0, 'new')",
                params![id],
            )
            .unwrap();
        }
        session(&mut conn, "s1", &items);
        conn.execute(
            "UPDATE llm_requests SET status = 'completed', evidence_hash = 'new'",
            params![],
        )
        .unwrap();
        conn.execute(
            "UPDATE llm_requests SET evidence_hash = 'old' WHERE item_id = 'a' AND stage = 'adjudicate'",
            params![],
        )
        .unwrap();
        conn.execute(
            "UPDATE llm_batch_session SET state = 'completed'",
            params![],
        )
        .unwrap();
        let (a1, b1) = (requests(&conn, "s1", "a"), requests(&conn, "s1", "b"));
        session(&mut conn, "s2", &items);
        let a2 = requests(&conn, "s2", "a");
        assert_eq!(
            a2.iter().map(|r| r.1).collect::<Vec<_>>(),
            [2, 2],
            "both stages of a asked anew: {a1:?} -> {a2:?}"
        );
        assert_eq!(requests(&conn, "s2", "b"), b1, "b's answers reused");
    }
}
