//! Policies operators set on a service: a cap on its running items and a rate limit on how
//! fast its items are handed out, both enforced by every broker's claims together.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Invalid;

/// Fastest rate a limit may name, items per second: beyond it a limit limits nothing a broker
/// can reach.
pub const MAX_RATE: f64 = 1_000_000.0;

/// Slowest rate a limit may name (0 aside): one item in about seventeen minutes. A slower one
/// would make the bucket's interval overflow the microseconds it is counted in.
pub const MIN_RATE: f64 = 0.001;

/// Largest burst: as many items as the widest claim batch could ever take at once.
pub const MAX_BURST: i64 = 1_000_000;

/// A change to a service's policy: the fields given, the rest kept as they are.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServicePolicyChange {
    pub max_running: Option<i32>,
    pub rate_per_second: Option<f64>,
    pub burst: Option<i32>,
}

fn invalid(field: &str, why: &str) -> Invalid {
    Invalid::new("invalid_policy", format!("{field}: {why}"))
}

/// An integer field within `min..=max`.
fn integer(value: &Value, field: &str, min: i64, max: i64) -> Result<i32, Invalid> {
    value
        .as_i64()
        .filter(|number| (min..=max).contains(number))
        .and_then(|number| i32::try_from(number).ok())
        .ok_or_else(|| invalid(field, &format!("must be an integer from {min} to {max}")))
}

impl ServicePolicyChange {
    /// Reads the body of `PUT /admin/services/{service}`; every error names the field at
    /// fault, and an unknown field is an error, so that a typo never passes for a policy.
    pub fn parse(value: &Value) -> Result<Self, Invalid> {
        let object = value.as_object().ok_or_else(|| {
            invalid("body", "must be an object with max_running, rate_per_second or burst")
        })?;
        let mut change = Self::default();
        for (key, value) in object {
            match key.as_str() {
                "max_running" => {
                    change.max_running = Some(integer(value, key, 0, i64::from(i32::MAX))?)
                }
                "rate_per_second" => {
                    let rate = value
                        .as_f64()
                        .filter(|rate| *rate == 0.0 || (MIN_RATE..=MAX_RATE).contains(rate))
                        .ok_or_else(|| {
                            let range = format!("from {MIN_RATE} to {MAX_RATE}");
                            invalid(key, &format!("must be 0 (no limit) or a number {range}"))
                        })?;
                    change.rate_per_second = Some(rate);
                }
                "burst" => change.burst = Some(integer(value, key, 1, MAX_BURST)?),
                other => {
                    return Err(invalid(
                        other,
                        "unknown field; a service's policy has max_running, rate_per_second \
                         and burst",
                    ))
                }
            }
        }
        Ok(change)
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fields_left_out_stay_unset() {
        let change = ServicePolicyChange::parse(&json!({"max_running": 3})).expect("valid");
        assert_eq!(change, ServicePolicyChange { max_running: Some(3), ..Default::default() });
        let all = json!({"max_running": 0, "rate_per_second": 2.5, "burst": 4});
        let change = ServicePolicyChange::parse(&all).expect("valid");
        assert_eq!(
            change,
            ServicePolicyChange {
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
            (json!([1]), "body"),
        ];
        for (body, field) in refusals {
            let refused = ServicePolicyChange::parse(&body).expect_err("refused");
            assert_eq!(refused.code, "invalid_policy");
            assert!(refused.message.starts_with(&format!("{field}: ")), "{}", refused.message);
        }
    }
}
