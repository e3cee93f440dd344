//! The ending lanes: a queue per lane, each report going to its owner's, so that two lanes of
//! one broker never wait on each other for an owner's rows (users, service_users), which every
//! ending of that owner writes.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::sync::{Mutex, PoisonError};

use lru::LruCache;

use super::outcome::AttemptEnding;
use super::Answer;
use crate::batch::Batches;
use crate::error::BrokerError;
use fairway_api::model::WorkItemId;

/// The queue one lane works off.
pub(super) type Lane = Batches<AttemptEnding, Result<Answer, BrokerError>>;

/// Items whose owner a broker remembers: about as many as its workers hold at once, with room
/// for leases that ended elsewhere (the reaper's, another broker's reports).
const MOST_OWNERS: usize = 65_536;

pub(super) struct EndingLanes {
    lanes: Vec<Lane>,
    /// The owner (a hash of the username) of each item this broker handed out and whose ending
    /// has not come yet, while there is more than one lane. A report on an item another broker
    /// handed out, or one pushed out by newer claims, goes by the item's id instead: a lane of
    /// its own for the report, if not its owner's.
    owners: Option<Mutex<LruCache<WorkItemId, u64>>>,
}

impl EndingLanes {
    /// `count` lanes, each running one batch of at most `most` reports at a time.
    pub(super) fn new(count: usize, most: usize) -> Self {
        let count = count.max(1);
        let owners = NonZeroUsize::new(MOST_OWNERS)
            .filter(|_| count > 1)
            .map(|capacity| Mutex::new(LruCache::new(capacity)));
        Self { lanes: (0..count).map(|_| Batches::new(1, most)).collect(), owners }
    }

    /// Remembers who owns an item this broker hands out, for the lane of its ending.
    pub(super) fn note_owner(&self, item: WorkItemId, owner: &str) {
        if let Some(owners) = &self.owners {
            owners.lock().unwrap_or_else(PoisonError::into_inner).put(item, hash(owner));
        }
    }

    /// The lane of the report ending `item`'s attempt; forgets the item's owner, since its
    /// attempt ends (a later attempt's claim notes it again).
    pub(super) fn lane_of(&self, item: WorkItemId) -> &Lane {
        let key = match &self.owners {
            None => return &self.lanes[0],
            Some(owners) => owners
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop(&item)
                .unwrap_or_else(|| hash(&item.0)),
        };
        // The remainder is below the lane count, a usize.
        &self.lanes[(key % self.lanes.len() as u64) as usize]
    }
}

fn hash<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(lanes: &EndingLanes, lane: &Lane) -> usize {
        lanes.lanes.iter().position(|each| std::ptr::eq(each, lane)).expect("one of the lanes")
    }

    #[test]
    fn one_owners_endings_go_to_one_lane_and_owners_spread_over_the_lanes() {
        let lanes = EndingLanes::new(4, 8);
        let mut used = std::collections::BTreeSet::new();
        for owner in 0..64 {
            let name = format!("user-{owner}");
            let items: Vec<WorkItemId> = (0..8).map(|n| WorkItemId(owner * 100 + n)).collect();
            for &item in &items {
                lanes.note_owner(item, &name);
            }
            let owned: Vec<usize> =
                items.iter().map(|&item| index(&lanes, lanes.lane_of(item))).collect();
            assert!(owned.iter().all(|&lane| lane == owned[0]), "{name}: {owned:?}");
            used.insert(owned[0]);
        }
        assert_eq!(used.len(), 4, "64 owners use every lane");
    }

    #[test]
    fn an_item_of_unknown_owner_goes_by_its_id_and_one_lane_needs_no_owners() {
        let lanes = EndingLanes::new(3, 8);
        let unknown = WorkItemId(7);
        assert_eq!(index(&lanes, lanes.lane_of(unknown)), index(&lanes, lanes.lane_of(unknown)));
        lanes.note_owner(WorkItemId(8), "ann");
        let noted = index(&lanes, lanes.lane_of(WorkItemId(8)));
        assert_eq!(noted, (hash(&"ann") % 3) as usize, "the owner's lane");
        assert_eq!(
            index(&lanes, lanes.lane_of(WorkItemId(8))),
            (hash(&8_i64) % 3) as usize,
            "forgotten once its ending took it"
        );
        let single = EndingLanes::new(1, 8);
        single.note_owner(WorkItemId(1), "ann");
        assert!(single.owners.is_none());
        assert_eq!(index(&single, single.lane_of(WorkItemId(1))), 0);
    }
}
