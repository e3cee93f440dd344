//! Every statement of the policies, one per `.sql` file beside it.

use chrono::{DateTime, Utc};

use crate::db::sql::{row, statement};

statement! {
    /// A service's policy, and its items running now.
    ServicePolicyOf<'a> = "service_policy" -> ServicePolicyRow {
        service: &'a str,
    }
}

row! {
    ServicePolicyRow {
        service: String,
        max_running: i32,
        rate_per_second: f64,
        burst: i32,
        running: i64,
        /// Whether a job has named the service or a policy exists for it.
        known: bool,
    }
}

statement! {
    /// Sets a service's policy; a field None keeps its value.
    SetServicePolicy<'a> = "set_service_policy" -> () {
        service: &'a str,
        max_running: Option<i32>,
        rate_per_second: Option<f64>,
        burst: Option<i32>,
    }
}

statement! {
    /// A user's policy, and its items running now; no row for a user never seen.
    UserPolicyOf<'a> = "user_policy" -> UserPolicyRow {
        username: &'a str,
    }
}

row! {
    UserPolicyRow {
        username: String,
        weight: i32,
        tier: i32,
        max_running: i32,
        rate_per_second: f64,
        burst: i32,
        running: i64,
        at_cap: bool,
        throttled_until: Option<DateTime<Utc>>,
    }
}

statement! {
    /// Sets a user's policy, creating the user; a field None keeps its value.
    SetUserPolicy<'a> = "set_user_policy" -> () {
        username: &'a str,
        weight: Option<i32>,
        max_running: Option<i32>,
        rate_per_second: Option<f64>,
        burst: Option<i32>,
        tier: Option<i32>,
    }
}
