//! Takes the TLS settings out of a libpq connection string, in either of its forms, and leaves
//! the rest for tokio-postgres, which refuses `sslrootcert` and the verifying modes.

use std::fmt;

use crate::ConnectionStringError;

/// libpq's `sslmode`, less `allow`, which tokio-postgres cannot express.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain connections only.
    Disable,
    /// TLS when the server offers it; a certificate is verified only against a root that is
    /// given. libpq's default.
    #[default]
    Prefer,
    /// TLS or no connection; a certificate is verified only against a root that is given.
    Require,
    /// TLS, with the server's certificate signed by a trusted CA.
    VerifyCa,
    /// TLS, with the certificate signed by a trusted CA and naming the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, ConnectionStringError> {
        Ok(match value {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => return Err(ConnectionStringError::UnknownSslMode(other.to_owned())),
        })
    }

    /// How tokio-postgres negotiates: the verifying modes insist on TLS as `require` does, and
    /// leave the verifying to the connector.
    pub fn negotiation(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Negotiation;
        match self {
            Self::Disable => Negotiation::Disable,
            Self::Prefer => Negotiation::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => Negotiation::Require,
        }
    }

    /// Whether the server's certificate must be verified whatever else is set.
    pub fn verifies(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyFull)
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        })
    }
}

/// The TLS settings a connection string named.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: Option<SslMode>,
    pub root_cert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

impl TlsSettings {
    /// Records `key = value` if it is a TLS setting; false if it is not one.
    fn take(&mut self, key: &str, value: String) -> Result<bool, ConnectionStringError> {
        match key {
            "sslmode" => self.mode = Some(SslMode::parse(&value)?),
            "sslrootcert" => self.root_cert = Some(value),
            "sslcert" => self.cert = Some(value),
            "sslkey" => self.key = Some(value),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// The connection string without its TLS settings, and those settings.
pub fn split_tls_settings(text: &str) -> Result<(String, TlsSettings), ConnectionStringError> {
    let trimmed = text.trim();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        split_url(trimmed)
    } else {
        split_key_values(trimmed)
    }
}

/// The URL form: TLS settings are query parameters, percent-encoded.
fn split_url(url: &str) -> Result<(String, TlsSettings), ConnectionStringError> {
    let mut settings = TlsSettings::default();
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), settings));
    };
    let mut kept = Vec::new();
    for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
        let (key, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        if !settings.take(&percent_decode(key)?, percent_decode(value)?)? {
            kept.push(parameter);
        }
    }
    let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((rest, settings))
}

fn percent_decode(text: &str) -> Result<String, ConnectionStringError> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(byte) = hex else {
                return Err(ConnectionStringError::Syntax(format!(
                    "`{text}` has a % not followed by two hex digits"
                )));
            };
            decoded.push(byte);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded)
        .map_err(|_| ConnectionStringError::Syntax(format!("`{text}` does not decode to UTF-8")))
}

/// The key=value form: `key = value` pairs apart by white space, a value either bare (a
/// backslash escapes the next character) or in single quotes (likewise).
fn split_key_values(text: &str) -> Result<(String, TlsSettings), ConnectionStringError> {
    let mut settings = TlsSettings::default();
    let mut kept = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ConnectionStringError::Syntax(format!("`{key}` has no `=` after it")));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => {
                        return Err(ConnectionStringError::Syntax(format!(
                            "the value of `{key}` has no closing quote"
                        )))
                    }
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        if !settings.take(&key, value.clone())? {
            kept.push(format!("{key}={}", quote(&value)));
        }
    }
    Ok((kept.join(" "), settings))
}

/// A value as the key=value form writes it, quoted so that tokio-postgres reads it back whole.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> (String, TlsSettings) {
        match split_tls_settings(text) {
            Ok(split) => split,
            Err(error) => panic!("{text}: {error}"),
        }
    }

    #[test]
    fn a_url_loses_only_its_tls_parameters() {
        let (rest, settings) = split(
            "postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write\
             &sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20dir%2Fca.crt&application_name=x",
        );
        assert_eq!(
            rest,
            "postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write&application_name=x"
        );
        assert_eq!(settings.mode, Some(SslMode::VerifyFull));
        assert_eq!(settings.root_cert.as_deref(), Some("/etc/ca dir/ca.crt"));
        let (rest, _) = split("postgres://h/db?sslmode=require");
        assert_eq!(rest, "postgres://h/db");
    }

    #[test]
    fn key_values_keep_their_quoting() {
        let (rest, settings) = split(
            r"host = /tmp/s  password='it\'s a \\secret' sslmode=verify-ca sslcert='/a b/c.pem' sslkey=/k",
        );
        assert_eq!(rest, r"host='/tmp/s' password='it\'s a \\secret'");
        let config: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&br"it's a \secret"[..]));
        assert_eq!(settings.mode, Some(SslMode::VerifyCa));
        assert_eq!(settings.cert.as_deref(), Some("/a b/c.pem"));
        assert_eq!(settings.key.as_deref(), Some("/k"));
    }

    #[test]
    fn bad_syntax_is_named() {
        for (text, expected) in [
            ("host", "`host` has no `=` after it"),
            ("host='x", "the value of `host` has no closing quote"),
            ("postgres://h/d?sslrootcert=%zz", "has a % not followed by two hex digits"),
        ] {
            let error = split_tls_settings(text).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains(expected), "{text}: {error}");
        }
        let error = split_tls_settings("sslmode=allow").err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.starts_with("sslmode=allow is not one of")));
    }

    #[test]
    fn modes_negotiate_as_libpq_does() {
        use tokio_postgres::config::SslMode as Negotiation;
        assert_eq!(SslMode::default().negotiation(), Negotiation::Prefer);
        assert_eq!(SslMode::Disable.negotiation(), Negotiation::Disable);
        assert_eq!(SslMode::VerifyCa.negotiation(), Negotiation::Require);
        assert!(SslMode::VerifyFull.verifies() && !SslMode::Require.verifies());
    }
}
