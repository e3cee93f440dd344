//! Retry policies: how many attempts a job's items get, and how long a retryable failure
//! waits before its next attempt. Parsed once from a submission's `retry` object, completed
//! with the broker's defaults, and asked for each retry's delay.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Invalid;

/// Most attempts a policy may allow.
pub const MAX_ATTEMPTS: u32 = 100;

/// The longest delay a policy may name: a retry scheduled further out is more likely a typo.
pub const LONGEST_DELAY: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How the delay before a retry grows with the failures so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Backoff {
    /// Ready again at once.
    None,
    /// `initial` every time.
    Fixed,
    /// `initial × 2^(n−1)` after the n-th failure, capped at `max`, with equal jitter.
    Exponential,
}

impl Backoff {
    pub const ALL: [Self; 3] = [Self::None, Self::Fixed, Self::Exponential];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Fixed => "fixed",
            Self::Exponential => "exponential",
        }
    }

    pub fn parse(name: &str) -> Result<Self, Invalid> {
        Self::ALL.into_iter().find(|backoff| backoff.as_str() == name).ok_or_else(|| {
            invalid(
                "retry.backoff",
                format!("{name:?} is not one of \"none\", \"fixed\", \"exponential\""),
            )
        })
    }
}

/// A submission's `retry` object as the producer wrote it: any field may be left to the
/// broker's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetrySpec {
    pub max_attempts: Option<u32>,
    pub backoff: Option<Backoff>,
    pub initial: Option<Duration>,
    pub max: Option<Duration>,
}

/// A job's complete retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts an item gets, the first included: 1 to 100.
    pub max_attempts: u32,
    pub backoff: Backoff,
    /// The first retry's delay (and every retry's, under `fixed`).
    pub initial: Duration,
    /// The longest delay `exponential` grows to.
    pub max: Duration,
}

/// A job's retry policy as its document shows it, delays written as a producer writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RetryDocument {
    /// Attempts an item gets, the first included.
    pub max_attempts: u32,
    pub backoff: Backoff,
    #[cfg_attr(feature = "openapi", schema(example = "2s"))]
    pub initial: String,
    #[cfg_attr(feature = "openapi", schema(example = "10m"))]
    pub max: String,
}

fn invalid(field: &str, why: impl std::fmt::Display) -> Invalid {
    Invalid::new("invalid_retry", format!("{field}: {why}"))
}

fn duration(value: &Value, field: &str) -> Result<Duration, Invalid> {
    let text = value
        .as_str()
        .ok_or_else(|| invalid(field, "must be a duration such as \"2s\" or \"10m\""))?;
    let parsed = humantime::parse_duration(text).map_err(|error| invalid(field, error))?;
    if parsed > LONGEST_DELAY {
        return Err(invalid(field, "must be at most 7 days"));
    }
    Ok(parsed)
}

impl RetrySpec {
    /// Reads a submission's `retry` object; every error names the field at fault.
    pub fn parse(value: &Value) -> Result<Self, Invalid> {
        let object = value.as_object().ok_or_else(|| {
            invalid("retry", "must be an object with max_attempts, backoff, initial and max")
        })?;
        let mut spec = Self::default();
        for (key, value) in object {
            match key.as_str() {
                "max_attempts" => {
                    let attempts = value
                        .as_u64()
                        .filter(|n| (1..=u64::from(MAX_ATTEMPTS)).contains(n))
                        .ok_or_else(|| {
                            invalid("retry.max_attempts", "must be an integer from 1 to 100")
                        })?;
                    spec.max_attempts = u32::try_from(attempts).ok();
                }
                "backoff" => {
                    let name = value.as_str().ok_or_else(|| {
                        invalid("retry.backoff", "must be \"none\", \"fixed\" or \"exponential\"")
                    })?;
                    spec.backoff = Some(Backoff::parse(name)?);
                }
                "initial" => spec.initial = Some(duration(value, "retry.initial")?),
                "max" => spec.max = Some(duration(value, "retry.max")?),
                other => {
                    return Err(invalid(
                        &format!("retry.{other}"),
                        "unknown field; expected max_attempts, backoff, initial or max",
                    ))
                }
            }
        }
        Ok(spec)
    }

    /// The whole policy, `defaults` filling what the producer left out. Refused when the
    /// first delay exceeds the cap.
    pub fn resolve(&self, defaults: &RetryPolicy) -> Result<RetryPolicy, Invalid> {
        let policy = RetryPolicy {
            max_attempts: self.max_attempts.unwrap_or(defaults.max_attempts),
            backoff: self.backoff.unwrap_or(defaults.backoff),
            initial: self.initial.unwrap_or(defaults.initial),
            max: self.max.unwrap_or(defaults.max),
        };
        if policy.backoff == Backoff::Exponential && policy.initial > policy.max {
            let field = if self.initial.is_some() { "retry.initial" } else { "retry.max" };
            return Err(invalid(
                field,
                format!(
                    "initial ({}) must not exceed max ({})",
                    humantime::format_duration(policy.initial),
                    humantime::format_duration(policy.max)
                ),
            ));
        }
        Ok(policy)
    }
}

impl RetryPolicy {
    pub fn document(&self) -> RetryDocument {
        RetryDocument {
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            initial: humantime::format_duration(self.initial).to_string(),
            max: humantime::format_duration(self.max).to_string(),
        }
    }

    /// Whether an item that has used `attempts` of its budget may have another.
    pub fn allows_another(&self, attempts: i64) -> bool {
        attempts < i64::from(self.max_attempts)
    }

    /// The delay before the retry that follows the `failures`-th failure (1-based) under this
    /// policy; `unit` is a random number in [0, 1).
    ///
    /// Exponential delays use equal jitter: half the capped delay, plus a random share of the
    /// other half. The items that failed together (a dependency down) spread over half the
    /// interval instead of coming back in one burst, yet no delay is shorter than half its
    /// step (full jitter's can be near zero) and, below the cap, the ranges of successive
    /// failures meet without overlapping, so each delay is at least the one before. At the
    /// cap, delays lie between half of `max` and `max`.
    pub fn delay(&self, failures: u32, unit: f64) -> Duration {
        match self.backoff {
            Backoff::None => Duration::ZERO,
            Backoff::Fixed => self.initial,
            Backoff::Exponential => {
                let capped = 2u32
                    .checked_pow(failures.saturating_sub(1))
                    .and_then(|factor| self.initial.checked_mul(factor))
                    .map_or(self.max, |grown| grown.min(self.max));
                let half = capped / 2;
                half + (capped - half).mul_f64(unit.clamp(0.0, 1.0))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            backoff: Backoff::Exponential,
            initial: Duration::from_secs(2),
            max: Duration::from_secs(600),
        }
    }

    fn policy(backoff: Backoff) -> RetryPolicy {
        RetryPolicy { backoff, ..defaults() }
    }

    #[test]
    fn a_whole_policy_parses() {
        let spec = RetrySpec::parse(
            &json!({"max_attempts": 5, "backoff": "fixed", "initial": "1s", "max": "1m"}),
        )
        .unwrap();
        assert_eq!(
            spec.resolve(&defaults()).unwrap(),
            RetryPolicy {
                max_attempts: 5,
                backoff: Backoff::Fixed,
                initial: Duration::from_secs(1),
                max: Duration::from_secs(60),
            }
        );
    }

    #[test]
    fn missing_fields_come_from_the_defaults() {
        let spec = RetrySpec::parse(&json!({"max_attempts": 2})).unwrap();
        assert_eq!(
            spec.resolve(&defaults()).unwrap(),
            RetryPolicy { max_attempts: 2, ..defaults() }
        );
    }

    #[test]
    fn bad_fields_are_named() {
        for (body, field) in [
            (json!({"max_attempts": 0}), "retry.max_attempts"),
            (json!({"max_attempts": 101}), "retry.max_attempts"),
            (json!({"max_attempts": 2.5}), "retry.max_attempts"),
            (json!({"max_attempts": "3"}), "retry.max_attempts"),
            (json!({"backoff": "linear"}), "retry.backoff"),
            (json!({"backoff": 1}), "retry.backoff"),
            (json!({"initial": "soon"}), "retry.initial"),
            (json!({"initial": 2}), "retry.initial"),
            (json!({"max": "30days"}), "retry.max"),
            (json!({"tries": 3}), "retry.tries"),
            (json!([1]), "retry"),
        ] {
            let error = RetrySpec::parse(&body).unwrap_err();
            assert_eq!(error.code, "invalid_retry", "{body}");
            assert!(error.message.starts_with(&format!("{field}:")), "{body}: {}", error.message);
        }
    }

    #[test]
    fn an_initial_delay_above_the_cap_is_refused() {
        let spec = RetrySpec::parse(&json!({"initial": "1h", "max": "1m"})).unwrap();
        let error = spec.resolve(&defaults()).unwrap_err();
        assert!(error.message.starts_with("retry.initial:"), "{}", error.message);
        let spec = RetrySpec::parse(&json!({"max": "1s"})).unwrap();
        let error = spec.resolve(&defaults()).unwrap_err();
        assert!(error.message.starts_with("retry.max:"), "{}", error.message);
    }

    #[test]
    fn the_budget_counts_attempts() {
        let policy = RetryPolicy { max_attempts: 3, ..defaults() };
        assert!(policy.allows_another(1));
        assert!(policy.allows_another(2));
        assert!(!policy.allows_another(3));
    }

    #[test]
    fn none_and_fixed_do_not_grow() {
        for failures in 1..10 {
            assert_eq!(policy(Backoff::None).delay(failures, 0.7), Duration::ZERO);
            assert_eq!(policy(Backoff::Fixed).delay(failures, 0.7), Duration::from_secs(2));
        }
    }

    #[test]
    fn exponential_doubles_within_equal_jitter() {
        let exponential = policy(Backoff::Exponential);
        for failures in 1..=8u32 {
            let full = Duration::from_secs(2 * (1 << (failures - 1))).min(Duration::from_secs(600));
            assert_eq!(exponential.delay(failures, 0.0), full / 2, "{failures}");
            assert_eq!(exponential.delay(failures, 1.0), full, "{failures}");
            let middle = exponential.delay(failures, 0.5);
            assert!(middle > full / 2 && middle < full, "{failures}: {middle:?}");
        }
    }

    #[test]
    fn exponential_grows_until_the_cap_then_stays_below_it() {
        let exponential = policy(Backoff::Exponential);
        let cap = Duration::from_secs(600);
        for failures in 1..200u32 {
            let longest = exponential.delay(failures, 1.0);
            assert!(longest <= cap, "{failures}: {longest:?}");
            if exponential.delay(failures + 1, 1.0) < cap {
                assert!(longest <= exponential.delay(failures + 1, 0.0), "{failures}");
            }
            assert!(exponential.delay(failures, 0.0) >= longest / 2, "{failures}");
        }
        assert_eq!(exponential.delay(u32::MAX, 1.0), cap);
    }
}
