//! The query-string extractor the handlers use: like `web::Query`, except that an error names
//! the parameter it is about. serde_urlencoded's own errors say "invalid digit found in
//! string" for `max=abc`, which names nothing.

use std::future::{ready, Ready};
use std::ops::Deref;

use actix_web::{dev::Payload, FromRequest, HttpRequest};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A query string deserialized into `T`.
pub struct Query<T>(pub T);

impl<T> Query<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> Deref for Query<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: DeserializeOwned> FromRequest for Query<T> {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(parse(request.query_string()).map(Query))
    }
}

/// Deserializes `query`; an error names the parameter whose value it could not read.
pub fn parse<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    serde_urlencoded::from_str(query).map_err(|error| {
        let message = error.to_string();
        let message = match culprit::<T>(query, &message) {
            Some((name, value)) => format!("invalid query parameter {name}={value:?}: {message}"),
            None => format!("invalid query string: {message}"),
        };
        ApiError::bad_request("invalid_query", message)
    })
}

/// The parameter an error is about. The deserializer reads the pairs in order and stops at
/// the first value it cannot read, so that pair is the last of the shortest prefix of the query
/// that fails with the same error. Errors about a field as a whole (missing, duplicate, unknown
/// variant) already name it.
fn culprit<T: DeserializeOwned>(query: &str, message: &str) -> Option<(String, String)> {
    if message.contains('`') {
        return None;
    }
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).ok()?;
    (1..=pairs.len()).find_map(|end| {
        let prefix = serde_urlencoded::to_string(&pairs[..end]).ok()?;
        match serde_urlencoded::from_str::<T>(&prefix) {
            Err(error) if error.to_string() == message => pairs.get(end - 1).cloned(),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Claim {
        service: String,
        #[serde(default)]
        worker: u32,
        #[serde(default)]
        max: u32,
    }

    fn message(query: &str) -> String {
        match parse::<Claim>(query) {
            Ok(claim) => panic!("{query} parsed: {claim:?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_bad_number_is_named_with_its_value() {
        assert!(message("service=s&max=abc").contains("max=\"abc\""), "{}", message("max=abc"));
        assert!(message("max=abc&service=s").contains("max=\"abc\""));
        assert!(message("worker=-1&service=s").contains("worker=\"-1\""));
        assert!(message("service=s&worker=1&max=1.5").contains("max=\"1.5\""));
    }

    #[test]
    fn a_missing_field_keeps_serdes_message() {
        assert!(message("max=1").contains("missing field `service`"), "{}", message("max=1"));
    }
}
