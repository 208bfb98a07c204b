//! Id fields answered from the prompt's ids, one candidate's at a time.

use super::Gen;

/// A prompt lists each candidate's ids together, in the order the answer
/// schema names them (a release group's id, then its recording's): an
/// object with `width` id fields takes all of them from one candidate, so
/// a suggested answer never pairs one candidate's group with another's
/// recording, or names a recording id as a group.
#[derive(Clone, Copy)]
pub(super) struct IdTuple {
    pub(super) width: usize,
    /// The first uuid of the chosen candidate, once chosen.
    pub(super) start: Option<usize>,
    pub(super) next: usize,
}

pub(super) fn is_id_like(name: &str) -> bool {
    let lname = name.to_ascii_lowercase();
    lname.ends_with("_id") || lname.ends_with("_mbid") || lname == "id" || lname == "mbid"
}

impl Gen<'_, '_, '_> {
    /// An id from the prompt for an id field: the next of one candidate's
    /// ids when the prompt's ids come in tuples as wide as the object's id
    /// fields, else any. One draw per field either way, so the answers
    /// that follow stay the same.
    pub(super) fn prompt_id(&mut self) -> String {
        let n = self.m.uuids().len();
        let i = self.m.rng.below(n);
        let index = match &mut self.ids {
            Some(t) if t.width > 1 && n.is_multiple_of(t.width) && t.next < t.width => {
                let start = *t.start.get_or_insert(i / t.width * t.width);
                t.next += 1;
                start + t.next - 1
            }
            _ => i,
        };
        self.m.uuids()[index].to_string()
    }
}
