//! Claim strategies (docs/strategies.md) and job metadata: what workers and producers
//! send, checked, and the strategy normalised into the list of attempts `claim_items` reads.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::Invalid;

/// Most keys a job's metadata may have.
pub const MAX_METADATA_KEYS: usize = 16;
/// Most characters of a metadata string value.
const MAX_VALUE_CHARS: usize = 255;
/// The bounds of a job's priority.
pub const PRIORITY_BOUND: i64 = 1_000_000;
/// Most nodes of a strategy expression, and how deep it may nest.
const MAX_NODES: usize = 16;
const MAX_DEPTH: usize = 8;
/// Most attempts a strategy may expand to (each prefer_distinct doubles those below it).
const MAX_ATTEMPTS: usize = 16;

/// A job's strategic metadata: keys and their values, a string or an integer each.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    pub keys: Vec<String>,
    pub values: Vec<Value>,
}

fn invalid_metadata(message: String) -> Invalid {
    Invalid::new("invalid_metadata", message)
}

/// Whether `key` is a metadata key: `^[a-z0-9_.-]{1,64}$`.
pub fn valid_key(key: &str) -> bool {
    (1..=64).contains(&key.len())
        && key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c))
}

/// Checks one metadata value: a string of 1 to 255 characters (no NUL), or an integer within
/// i64. `what` names it for the error.
fn check_value(value: &Value, what: &str) -> Result<(), String> {
    match value {
        Value::String(text) => {
            let chars = text.chars().count();
            if chars == 0 || chars > MAX_VALUE_CHARS || text.contains('\0') {
                return Err(format!(
                    "{what} must be a string of 1 to {MAX_VALUE_CHARS} characters without NUL"
                ));
            }
            Ok(())
        }
        Value::Number(number) if number.is_i64() => Ok(()),
        Value::Number(_) => Err(format!("{what} must be an integer within i64, not {value}")),
        _ => Err(format!("{what} must be a string or an integer, not {value}")),
    }
}

impl Metadata {
    /// Reads a producer's `metadata`: an object of at most 16 keys, each `^[a-z0-9_.-]{1,64}$`.
    pub fn parse(value: &Value) -> Result<Self, Invalid> {
        let Value::Object(fields) = value else {
            return Err(invalid_metadata(format!("metadata must be an object, not {value}")));
        };
        if fields.len() > MAX_METADATA_KEYS {
            return Err(invalid_metadata(format!(
                "metadata has {} keys; at most {MAX_METADATA_KEYS} are allowed",
                fields.len()
            )));
        }
        let mut metadata = Self::default();
        for (key, value) in fields {
            if !valid_key(key) {
                return Err(invalid_metadata(format!(
                    "metadata key {key:?} must be 1 to 64 characters of [a-z0-9_.-]"
                )));
            }
            check_value(value, &format!("metadata value of {key:?}")).map_err(invalid_metadata)?;
            metadata.keys.push(key.clone());
            metadata.values.push(value.clone());
        }
        Ok(metadata)
    }
}

/// Reads a producer's `priority`: an integer in [-1000000, 1000000].
pub fn parse_priority(value: &Value) -> Result<i32, Invalid> {
    value
        .as_i64()
        .filter(|priority| priority.abs() <= PRIORITY_BOUND)
        .and_then(|priority| i32::try_from(priority).ok())
        .ok_or_else(|| {
            Invalid::new(
                "invalid_priority",
                format!(
                    "priority must be an integer from -{PRIORITY_BOUND} to {PRIORITY_BOUND}, \
                     not {value}"
                ),
            )
        })
}

/// The orders a strategy's leaves name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Fair,
    Oldest,
    Newest,
    Random,
    Priority,
}

impl Order {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "fair" => Self::Fair,
            "oldest" => Self::Oldest,
            "newest" => Self::Newest,
            "random" => Self::Random,
            "priority" => Self::Priority,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Fair => "fair",
            Self::Oldest => "oldest",
            Self::Newest => "newest",
            Self::Random => "random",
            Self::Priority => "priority",
        }
    }
}

/// One attempt of a strategy: an order, the metadata a job must have, and the caps on running
/// items per metadata value (hard: max_simultaneous; soft: prefer_distinct's first pass).
#[derive(Debug, Clone)]
struct Attempt {
    order: Order,
    only: Vec<(String, Value)>,
    caps: Vec<(String, i64, bool)>,
}

impl Attempt {
    fn is_plain_fair(&self) -> bool {
        self.order == Order::Fair && self.only.is_empty() && self.caps.is_empty()
    }

    fn to_json(&self) -> Value {
        json!({
            "order": self.order.as_str(),
            "only": self.only.iter()
                .map(|(key, value)| json!({ "key": key, "value": value }))
                .collect::<Vec<_>>(),
            "caps": self.caps.iter()
                .map(|(key, max, hard)| json!({ "key": key, "max": max, "hard": hard }))
                .collect::<Vec<_>>(),
        })
    }
}

/// A worker's strategy, checked and normalised into the attempts `claim_items` makes in turn.
#[derive(Debug, Clone)]
pub struct Strategy {
    attempts: Vec<Attempt>,
}

fn invalid_strategy(message: impl Into<String>) -> Invalid {
    Invalid::new("invalid_strategy", message.into())
}

impl Strategy {
    /// Reads `strategy=`: JSON, or a leaf's bare name (`strategy=random`).
    pub fn parse(text: &str) -> Result<Self, Invalid> {
        let trimmed = text.trim();
        let expression = if trimmed.starts_with(['{', '[', '"']) {
            serde_json::from_str(trimmed)
                .map_err(|error| invalid_strategy(format!("strategy is not valid JSON: {error}")))?
        } else {
            Value::String(trimmed.to_owned())
        };
        let mut nodes = 0;
        let attempts = expand(&expression, 1, &mut nodes)?;
        if attempts.len() > MAX_ATTEMPTS {
            return Err(invalid_strategy(format!(
                "strategy expands to {} attempts (each prefer_distinct doubles the attempts \
                 below it); at most {MAX_ATTEMPTS} are allowed",
                attempts.len()
            )));
        }
        Ok(Self { attempts })
    }

    /// The attempts as `claim_items` reads them, or None for the plain fair order. Attempts
    /// after a plain fair one are dropped: the fair order already offers everything they could.
    pub fn to_claim_argument(&self) -> Option<Arc<Value>> {
        if self.attempts.first().is_some_and(Attempt::is_plain_fair) {
            return None;
        }
        let end = self
            .attempts
            .iter()
            .position(Attempt::is_plain_fair)
            .map_or(self.attempts.len(), |fair| fair + 1);
        Some(Arc::new(Value::Array(self.attempts[..end].iter().map(Attempt::to_json).collect())))
    }
}

/// Whether a normalised strategy falls back on the plain fair order at its end.
pub fn ends_in_fair(attempts: &Value) -> bool {
    attempts.as_array().and_then(|attempts| attempts.last()).is_some_and(|last| {
        last["order"] == "fair"
            && last["only"].as_array().is_some_and(Vec::is_empty)
            && last["caps"].as_array().is_some_and(Vec::is_empty)
    })
}

/// Whether a normalised strategy has a hard cap, whose capacity frees without a notification.
pub fn has_hard_cap(attempts: &Value) -> bool {
    attempts.as_array().into_iter().flatten().any(|attempt| {
        attempt["caps"].as_array().into_iter().flatten().any(|cap| cap["hard"] == true)
    })
}

/// The fields of a combinator's object, checked for exactly `expected`.
fn fields<'a>(
    name: &str,
    body: &'a Value,
    expected: &[&str],
) -> Result<&'a Map<String, Value>, Invalid> {
    let Value::Object(fields) = body else {
        return Err(invalid_strategy(format!(
            "{name} takes an object with {}, not {body}",
            expected.join(", ")
        )));
    };
    for field in expected {
        if !fields.contains_key(*field) {
            return Err(invalid_strategy(format!("{name} is missing its field {field:?}")));
        }
    }
    if let Some(unknown) = fields.keys().find(|key| !expected.contains(&key.as_str())) {
        return Err(invalid_strategy(format!(
            "{name} has an unknown field {unknown:?}; it takes {}",
            expected.join(", ")
        )));
    }
    Ok(fields)
}

fn key_field(name: &str, fields: &Map<String, Value>) -> Result<String, Invalid> {
    match fields.get("key").and_then(Value::as_str) {
        Some(key) if valid_key(key) => Ok(key.to_owned()),
        _ => Err(invalid_strategy(format!(
            "{name}'s key must be a string of 1 to 64 characters of [a-z0-9_.-]"
        ))),
    }
}

fn max_field(name: &str, fields: &Map<String, Value>) -> Result<i64, Invalid> {
    match fields.get("max").and_then(Value::as_i64) {
        Some(max) if (1..=i64::from(i32::MAX)).contains(&max) => Ok(max),
        _ => Err(invalid_strategy(format!(
            "{name}'s max must be an integer from 1 to {}, not {}",
            i32::MAX,
            fields.get("max").unwrap_or(&Value::Null)
        ))),
    }
}

/// Expands one node into its attempts, counting nodes and depth as it goes.
fn expand(node: &Value, depth: usize, nodes: &mut usize) -> Result<Vec<Attempt>, Invalid> {
    *nodes += 1;
    if *nodes > MAX_NODES {
        return Err(invalid_strategy(format!("strategy has more than {MAX_NODES} nodes")));
    }
    if depth > MAX_DEPTH {
        return Err(invalid_strategy(format!("strategy nests deeper than {MAX_DEPTH} levels")));
    }
    let combinator = match node {
        Value::String(name) => {
            let order = Order::parse(name).ok_or_else(|| {
                invalid_strategy(format!(
                    "unknown strategy {name:?}; the leaves are fair, oldest, newest, random and \
                     priority"
                ))
            })?;
            return Ok(vec![Attempt { order, only: Vec::new(), caps: Vec::new() }]);
        }
        Value::Object(object) if object.len() == 1 => object.iter().next(),
        _ => None,
    };
    let Some((name, body)) = combinator else {
        return Err(invalid_strategy(format!(
            "a strategy is a leaf's name or an object with one of select_only, prefer_distinct, \
             max_simultaneous, or_else; not {node}"
        )));
    };
    match name.as_str() {
        "select_only" => {
            let fields = fields(name, body, &["key", "value", "then"])?;
            let key = key_field(name, fields)?;
            let value = fields.get("value").unwrap_or(&Value::Null);
            check_value(value, "select_only's value").map_err(invalid_strategy)?;
            let mut attempts = expand(&fields["then"], depth + 1, nodes)?;
            for attempt in &mut attempts {
                attempt.only.insert(0, (key.clone(), value.clone()));
            }
            Ok(attempts)
        }
        "prefer_distinct" | "max_simultaneous" => {
            let fields = fields(name, body, &["key", "max", "then"])?;
            let key = key_field(name, fields)?;
            let max = max_field(name, fields)?;
            let below = expand(&fields["then"], depth + 1, nodes)?;
            let hard = name == "max_simultaneous";
            let mut attempts = below.clone();
            for attempt in &mut attempts {
                attempt.caps.push((key.clone(), max, hard));
            }
            // Soft: the values over the limit come after everything else, so the same
            // attempts follow without the cap.
            if !hard {
                attempts.extend(below);
            }
            Ok(attempts)
        }
        "or_else" => {
            let branches = match body {
                Value::Array(branches) if branches.len() == 2 => branches,
                _ => {
                    return Err(invalid_strategy(format!(
                        "or_else takes a list of two strategies, not {body}"
                    )))
                }
            };
            let mut attempts = expand(&branches[0], depth + 1, nodes)?;
            attempts.extend(expand(&branches[1], depth + 1, nodes)?);
            Ok(attempts)
        }
        other => Err(invalid_strategy(format!(
            "unknown strategy {other:?}; the combinators are select_only, prefer_distinct, \
             max_simultaneous and or_else"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempts(text: &str) -> Value {
        Strategy::parse(text)
            .expect("valid")
            .to_claim_argument()
            .map_or(Value::Null, |attempts| (*attempts).clone())
    }

    fn error(text: &str) -> String {
        match Strategy::parse(text) {
            Err(Invalid { code: "invalid_strategy", message }) => message,
            other => panic!("{text}: expected invalid_strategy, got {other:?}"),
        }
    }

    #[test]
    fn fair_is_the_plain_claim_and_leaves_may_be_bare() {
        assert_eq!(attempts("fair"), Value::Null);
        assert_eq!(attempts("\"fair\""), Value::Null);
        assert_eq!(attempts("random")[0]["order"], "random");
    }

    #[test]
    fn prefer_distinct_tries_under_the_limit_first_then_without_it() {
        let expanded =
            attempts(r#"{"prefer_distinct": {"key": "customer", "max": 2, "then": "random"}}"#);
        assert_eq!(
            expanded,
            json!([
                {"order": "random", "only": [], "caps": [{"key": "customer", "max": 2, "hard": false}]},
                {"order": "random", "only": [], "caps": []},
            ])
        );
    }

    #[test]
    fn or_else_concatenates_and_stops_at_a_plain_fair() {
        let expanded = attempts(
            r#"{"or_else": [{"select_only": {"key": "mode", "value": "a", "then": "oldest"}},
                            {"or_else": ["fair", "random"]}]}"#,
        );
        assert_eq!(expanded.as_array().map(Vec::len), Some(2));
        assert_eq!(expanded[0]["only"], json!([{"key": "mode", "value": "a"}]));
        assert!(ends_in_fair(&expanded));
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        assert!(error("fastest").contains("unknown strategy \"fastest\""));
        assert!(error(r#"{"max_simultaneous": {"key": "c", "max": 0, "then": "oldest"}}"#)
            .contains("max must be an integer from 1"));
        assert!(error(r#"{"select_only": {"key": "c", "then": "oldest"}}"#)
            .contains("missing its field \"value\""));
        assert!(error("{\"or_else\": [\"oldest\"").contains("not valid JSON"));
        assert!(error(r#"{"or_else": ["oldest"]}"#).contains("list of two"));
        let mut deep = json!("oldest");
        for _ in 0..8 {
            deep = json!({"select_only": {"key": "k", "value": 1, "then": deep}});
        }
        assert!(error(&deep.to_string()).contains("deeper than 8"));
        let mut wide = json!("oldest");
        for _ in 0..4 {
            wide = json!({"or_else": [wide, wide]});
        }
        assert!(error(&wide.to_string()).contains("more than 16 nodes"));
    }

    #[test]
    fn metadata_and_priority_shapes_are_checked() {
        assert!(Metadata::parse(&json!({"customer": "acme", "n": 3})).is_ok());
        for bad in [
            json!([1]),
            json!({"k": {"nested": 1}}),
            json!({"k": 1.5}),
            json!({"k": true}),
            json!({"Bad": 1}),
            json!({"k": ""}),
            Value::Object((0..17).map(|n| (format!("k{n}"), json!(n))).collect()),
        ] {
            assert!(Metadata::parse(&bad).is_err(), "{bad}");
        }
        assert_eq!(parse_priority(&json!(-1_000_000)).ok(), Some(-1_000_000));
        assert!(parse_priority(&json!(1_000_001)).is_err());
        assert!(parse_priority(&json!(1.5)).is_err());
        assert!(parse_priority(&json!("1")).is_err());
    }
}
