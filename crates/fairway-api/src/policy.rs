//! Policies operators set on a user, a tenant or a service: a weight (users and tenants), a
//! cap on running items and a rate limit on how fast items are handed out, all enforced by
//! every broker's claims together.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::Invalid;

/// Fastest rate a limit may name, items per second: beyond it a limit limits nothing a broker
/// can reach.
pub const MAX_RATE: f64 = 1_000_000.0;

/// Slowest rate a limit may name (0 aside): one item in about seventeen minutes. A slower one
/// would make the bucket's interval overflow the microseconds it is counted in.
pub const MIN_RATE: f64 = 0.001;

/// Largest burst: as many items as the widest claim batch could ever take at once.
pub const MAX_BURST: i64 = 1_000_000;

/// Largest weight: with it, the fair order's integer shares compare exactly (docs/policy-design.md).
pub const MAX_WEIGHT: i64 = 1000;

/// The tiers an operator may grant a user or tenant, lower served first; 3 unless set.
pub const TIERS: std::ops::RangeInclusive<i64> = 1..=5;

/// A change to a policy: the fields given, the rest kept as they are. A service has no weight
/// and no tier.
/// Serialized, it is the body of the `PUT` that makes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PolicyChange {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_running: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<i32>,
}

/// What a policy is set on: it decides which fields a body may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyOf {
    User,
    Tenant,
    Service,
}

impl PolicyOf {
    fn fields(self) -> &'static str {
        match self {
            PolicyOf::User => "weight, tier, max_running, rate_per_second and burst",
            PolicyOf::Tenant => {
                "max_queriers, max_outstanding, weight, tier, max_running, rate_per_second and \
                 burst"
            }
            PolicyOf::Service => "max_running, rate_per_second and burst",
        }
    }
}

fn invalid(field: &str, why: &str) -> Invalid {
    Invalid::new("invalid_policy", format!("{field}: {why}"))
}

/// An integer field within `min..=max`.
pub(crate) fn integer(value: &Value, field: &str, min: i64, max: i64) -> Result<i32, Invalid> {
    value
        .as_i64()
        .filter(|number| (min..=max).contains(number))
        .and_then(|number| i32::try_from(number).ok())
        .ok_or_else(|| invalid(field, &format!("must be an integer from {min} to {max}")))
}

/// The body's fields, or an error saying which fields `of` takes.
pub(crate) fn object(value: &Value, of: PolicyOf) -> Result<&Map<String, Value>, Invalid> {
    value
        .as_object()
        .ok_or_else(|| invalid("body", &format!("must be an object with any of {}", of.fields())))
}

/// The error for a field `of` does not take.
pub(crate) fn unknown(field: &str, of: PolicyOf) -> Invalid {
    invalid(field, &format!("unknown field; this policy has {}", of.fields()))
}

impl PolicyChange {
    /// Reads the body of `PUT /admin/users/{user}` or `PUT /admin/services/{service}`; every
    /// error names the field at fault, and an unknown field is an error, so that a typo never
    /// passes for a policy.
    pub fn parse(value: &Value, of: PolicyOf) -> Result<Self, Invalid> {
        let mut change = Self::default();
        for (key, value) in object(value, of)? {
            if !change.read(key, value, of)? {
                return Err(unknown(key, of));
            }
        }
        Ok(change)
    }

    /// Reads one field into the change; false when the field is not a policy field of `of`.
    pub(crate) fn read(&mut self, key: &str, value: &Value, of: PolicyOf) -> Result<bool, Invalid> {
        match key {
            "weight" if of != PolicyOf::Service => {
                self.weight = Some(integer(value, key, 1, MAX_WEIGHT)?);
            }
            "tier" if of != PolicyOf::Service => {
                self.tier = Some(integer(value, key, *TIERS.start(), *TIERS.end())?);
            }
            "max_running" => self.max_running = Some(integer(value, key, 0, i64::from(i32::MAX))?),
            "rate_per_second" => {
                let rate = value
                    .as_f64()
                    .filter(|rate| *rate == 0.0 || (MIN_RATE..=MAX_RATE).contains(rate))
                    .ok_or_else(|| {
                        let range = format!("from {MIN_RATE} to {MAX_RATE}");
                        invalid(key, &format!("must be 0 (no limit) or a number {range}"))
                    })?;
                self.rate_per_second = Some(rate);
            }
            "burst" => self.burst = Some(integer(value, key, 1, MAX_BURST)?),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A service's policy and what it holds now, as `GET /admin/services/{service}` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServicePolicyDocument {
    pub service: String,
    /// Most items running at once over every broker; 0: no cap.
    pub max_running: i32,
    /// Items handed out per second over every broker; 0: no limit.
    pub rate_per_second: f64,
    /// Items handed out at once after a quiet spell.
    pub burst: i32,
    /// The service's items running now.
    pub running: i64,
}

/// A user's policy and what it holds now, as `GET /admin/users/{user}` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserPolicyDocument {
    pub user: String,
    /// The user's share of the workers against other backlogged users': 1 to 1000.
    pub weight: i32,
    /// The user's tier, 1 to 5: within its tenant, a lower tier is served first.
    pub tier: i32,
    /// Most items of the user running at once over every broker and service; 0: no cap.
    pub max_running: i32,
    /// Items handed out per second over every broker; 0: no limit.
    pub rate_per_second: f64,
    /// Items handed out at once after a quiet spell.
    pub burst: i32,
    /// The user's items running now, over every service.
    pub running: i64,
    /// Whether the user is at its cap: claims pass it over until an item of it ends.
    pub at_cap: bool,
    /// When the user's next item is due, while its rate limit's bucket is empty.
    pub throttled_until: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fields_left_out_stay_unset() {
        let change =
            PolicyChange::parse(&json!({"max_running": 3}), PolicyOf::Service).expect("valid");
        assert_eq!(change, PolicyChange { max_running: Some(3), ..Default::default() });
        let all = json!({"max_running": 0, "rate_per_second": 2.5, "burst": 4});
        let change = PolicyChange::parse(&all, PolicyOf::Service).expect("valid");
        assert_eq!(
            change,
            PolicyChange {
                weight: None,
                tier: None,
                max_running: Some(0),
                rate_per_second: Some(2.5),
                burst: Some(4)
            }
        );
    }

    #[test]
    fn bad_values_are_refused_naming_their_field() {
        let refusals = [
            (json!({"max_running": -1}), "max_running"),
            (json!({"max_running": 1.5}), "max_running"),
            (json!({"max_running": "3"}), "max_running"),
            (json!({"rate_per_second": -0.5}), "rate_per_second"),
            (json!({"rate_per_second": "fast"}), "rate_per_second"),
            (json!({"rate_per_second": 1e-300}), "rate_per_second"),
            (json!({"burst": 0}), "burst"),
            (json!({"burst": 2_000_000}), "burst"),
            (json!({"weight": 2}), "weight"),
            (json!({"tier": 2}), "tier"),
            (json!([1]), "body"),
        ];
        for (body, field) in refusals {
            let refused = PolicyChange::parse(&body, PolicyOf::Service).expect_err("refused");
            assert_eq!(refused.code, "invalid_policy");
            assert!(refused.message.starts_with(&format!("{field}: ")), "{}", refused.message);
        }
    }

    #[test]
    fn weights_are_whole_numbers_from_one_to_a_thousand() {
        let change = PolicyChange::parse(&json!({"weight": 1000}), PolicyOf::User).expect("valid");
        assert_eq!(change.weight, Some(1000));
        for weight in [json!(0), json!(1001), json!(1.5), json!("2"), json!(-3)] {
            let refused = PolicyChange::parse(&json!({ "weight": weight }), PolicyOf::User)
                .expect_err("refused");
            assert!(refused.message.starts_with("weight: "), "{}", refused.message);
        }
        let refused = PolicyChange::parse(&json!({"wieght": 2}), PolicyOf::User).expect_err("typo");
        assert!(refused.message.starts_with("wieght: unknown field"), "{}", refused.message);
    }

    #[test]
    fn tiers_are_whole_numbers_from_one_to_five() {
        for of in [PolicyOf::User, PolicyOf::Tenant] {
            let change = PolicyChange::parse(&json!({"tier": 1}), of).expect("valid");
            assert_eq!(change.tier, Some(1));
            for tier in [json!(0), json!(6), json!(2.5), json!("1"), json!(null)] {
                let refused =
                    PolicyChange::parse(&json!({ "tier": tier }), of).expect_err("refused");
                assert_eq!(refused.message, "tier: must be an integer from 1 to 5");
            }
        }
    }
}
