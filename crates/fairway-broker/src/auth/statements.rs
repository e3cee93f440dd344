//! Every statement of the tokens, one per `.sql` file beside it.

use crate::db::sql::{row, statement};
use crate::rows::TokenRow;
use fairway_api::tokens::TokenDocument;

statement! {
    TokensExist = "tokens_exist" -> AnyToken {}
}

statement! {
    TokensTableExists = "tokens_table_exists" -> AnyToken {}
}

row! {
    AnyToken {
        exists: bool,
    }
}

statement! {
    /// The token of this SHA-256, revoked or expired ones too.
    FindToken<'a> = "find_token" -> TokenRow {
        hash: &'a [u8],
    }
}

statement! {
    /// A new token; no row when a live token has the name.
    InsertToken<'a> = "insert_token" -> TokenDocument {
        name: &'a str,
        role: &'a str,
        tenants: Option<&'a [String]>,
        services: Option<&'a [String]>,
        hash: &'a [u8],
        expires_in_millis: Option<i64>,
    }
}

statement! {
    ListTokens = "list_tokens" -> TokenDocument {}
}

statement! {
    RevokeToken = "revoke_token" -> TokenDocument {
        id: i64,
    }
}

statement! {
    TouchToken = "touch_token" -> () {
        id: i64,
    }
}

statement! {
    EnsureAdminToken<'a> = "ensure_admin_token" -> () {
        name: &'a str,
        hash: &'a [u8],
    }
}
