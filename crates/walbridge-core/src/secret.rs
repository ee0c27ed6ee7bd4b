//! Secrets read from the configuration.

use serde::Deserialize;

/// A bearer token that requests must carry (the admin endpoint, the
/// change feed), meant to come from the environment: `token =
/// "${WALBRIDGE_ADMIN_TOKEN}"`. Never printed.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct BearerToken(String);

impl BearerToken {
    /// Whether `given` is the token, in time that does not depend on
    /// where they differ.
    pub fn matches(&self, given: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
    }

    /// Whether `header`, an `Authorization` value, carries the token.
    pub fn authorizes(&self, header: Option<&str>) -> bool {
        header
            .and_then(|h| h.strip_prefix("Bearer "))
            .is_some_and(|given| self.matches(given.trim()))
    }

    /// True when the token is empty (an unset variable expanded to nothing).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The token, for a client's `Authorization` header.
    pub fn reveal(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(…)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_after_bearer_authorizes() {
        let token = BearerToken("s3cret".into());
        assert!(token.authorizes(Some("Bearer s3cret")));
        assert!(token.authorizes(Some("Bearer s3cret ")));
        for wrong in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "s3cret",
            "Basic s3cret",
            "",
        ] {
            assert!(!token.authorizes(Some(wrong)), "{wrong}");
        }
        assert!(!token.authorizes(None));
        assert_eq!(format!("{token:?}"), "BearerToken(…)");
    }
}
