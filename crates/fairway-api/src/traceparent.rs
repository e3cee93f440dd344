//! W3C Trace Context's `traceparent`: the trace a producer's job belongs to, which the broker
//! stores with the job and hands to the job's workers, so that they continue the same trace.

use serde::{Deserialize, Serialize};

use crate::Invalid;

/// A well-formed `traceparent` (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`), kept
/// as the producer sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TraceParent(String);

impl TraceParent {
    /// Accepts what the W3C recommendation lets a receiver accept: lowercase hex fields, a
    /// trace id and span id that are not all zeros, and any version but `ff`. A version after
    /// `00` may carry more fields after the flags; they are kept.
    pub fn parse(text: &str) -> Result<Self, Invalid> {
        let invalid = || {
            Invalid::new(
                "invalid_traceparent",
                format!(
                    "traceparent {text:?} is not a W3C trace context: \
                     00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, in lowercase"
                ),
            )
        };
        let mut fields = text.split('-');
        let mut field = |length: usize| {
            fields.next().filter(|field| {
                field.len() == length
                    && field.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            })
        };
        let (Some(version), Some(trace_id), Some(span_id), Some(_flags)) =
            (field(2), field(32), field(16), field(2))
        else {
            return Err(invalid());
        };
        let all_zeros = |field: &str| field.bytes().all(|b| b == b'0');
        let more_fields = fields.next().is_some();
        if version == "ff"
            || (version == "00" && more_fields)
            || all_zeros(trace_id)
            || all_zeros(span_id)
        {
            return Err(invalid());
        }
        Ok(Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.0[3..35]
    }

    /// The producer's span, the parent of what continues its trace: 16 lowercase hex digits.
    pub fn span_id(&self) -> &str {
        &self.0[36..52]
    }

    /// Whether the producer sampled its trace (the flags' lowest bit).
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.0[53..55], 16).is_ok_and(|flags| flags & 1 == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::TraceParent;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_is_kept_and_read() {
        let parent = TraceParent::parse(VALID).expect("valid");
        assert_eq!(parent.as_str(), VALID);
        assert_eq!(parent.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent.span_id(), "00f067aa0ba902b7");
        assert!(parent.sampled());
        let unsampled = TraceParent::parse(&VALID.replace("-01", "-00")).expect("valid");
        assert!(!unsampled.sampled());
    }

    #[test]
    fn a_later_version_may_carry_more_fields() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(TraceParent::parse(later).is_ok());
    }

    #[test]
    fn malformed_traceparents_are_refused_with_a_code() {
        for text in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ] {
            let error = TraceParent::parse(text).expect_err(text);
            assert_eq!(error.code, "invalid_traceparent", "{text}");
        }
    }
}
