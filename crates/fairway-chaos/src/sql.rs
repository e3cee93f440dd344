//! The fault suite's own statements, one file each in this crate's `sql/`: what it reads back
//! to check that nothing was lost or done twice.

fairway_broker::statements! {
    "../sql/";
    CAP_PEAKS = "cap_peaks";
    ITEM_TOTALS = "item_totals";
    JOB_OUTCOMES = "job_outcomes";
    LOST_CLAIMS = "lost_claims";
    LOST_ENDINGS = "lost_endings";
    LOST_JOBS = "lost_jobs";
    RELATION_SIZES = "relation_sizes";
    WATCH_CAPS = "watch_caps";
}

pub use fairway_broker::db::sql::*;
