//! The benchmark's own statements, one file each in this crate's `sql/`: its baselines' claims
//! and completions, and how it seeds and resets the data.

fairway_broker::statements! {
    "../sql/";
    BASELINE_INDEXES = "baseline_indexes";
    FIFO_CLAIM = "fifo_claim";
    FIFO_COMPLETE = "fifo_complete";
    FIFO_COMPLETE_BATCH = "fifo_complete_batch";
    FIFO_COUNTED_CLAIM = "fifo_counted_claim";
    FIFO_COUNTED_COMPLETE_BATCH = "fifo_counted_complete_batch";
    FIFO_USER_COUNTED_CLAIM = "fifo_user_counted_claim";
    FIFO_USER_COUNTED_COMPLETE_BATCH = "fifo_user_counted_complete_batch";
    HARMONY_CLAIM_ITEM = "harmony_claim_item";
    HARMONY_COUNT_CLAIM = "harmony_count_claim";
    HARMONY_COUNT_COMPLETION = "harmony_count_completion";
    HARMONY_LEAST_RUNNING_JOB = "harmony_least_running_job";
    HARMONY_LEAST_RUNNING_USER = "harmony_least_running_user";
    HARMONY_ROUND_ROBIN_JOB = "harmony_round_robin_job";
    HARMONY_SCHEMA = "harmony_schema";
    LOCK_WAITERS = "lock_waiters";
    RESET_ITEMS = "reset_items";
    SEED_COUNTERS = "seed_counters";
    SEED_METADATA = "seed_metadata";
    SEED_OTHER_SERVICES = "seed_other_services";
    WAL_WRITES = "wal_writes";
}

pub use fairway_broker::db::sql::*;
