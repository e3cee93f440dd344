//! Bearer tokens and who may do what (docs/security.md).
//!
//! A token is `fw_` and 64 hex digits: 256 random bits from the operating system. It is shown
//! once, when made; PostgreSQL keeps only its SHA-256 (`tokens.hash`), so that every broker on
//! the database agrees on it, and a copy of the database gives no token away. A request's token
//! is hashed and looked up by its hash, then the stored hash is compared with the computed one
//! in constant time; no comparison ever sees the token itself.
//!
//! Each broker keeps what it looked up for a few seconds (`--auth-cache-ttl`), keyed by hash, so
//! that a claim pays a hash and a map lookup rather than a query; a revoked token is refused by
//! every broker once its entry ages out. A token's last use is written at most once a minute
//! per broker, off the request's path.
//!
//! Auth is on when the broker has `FAIRWAY_ADMIN_TOKEN` or the database holds any token
//! (revoked ones too): a broker without tokens turns it on within `--auth-cache-ttl` of the
//! first one being made, by any broker, and never turns it off while it runs.

pub mod statements;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use deadpool_postgres::Pool;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::db::sql;
use crate::error::BrokerError;
use crate::maintenance::Upkeep;
use crate::rows::TokenRow;
use fairway_api::model::{ServiceName, TenantName};
use fairway_api::tokens::{Role, TokenDocument};
use statements::{
    EnsureAdminToken, FindToken, InsertToken, ListTokens, RevokeToken, TokensExist,
    TokensTableExists, TouchToken,
};

/// What the token in front of every token's hex digits says: a fairway token.
const PREFIX: &str = "fw_";

/// Shortest `FAIRWAY_ADMIN_TOKEN` accepted: a token is only as strong as its entropy.
pub const MIN_ADMIN_TOKEN_LEN: usize = 32;

/// The longest a token may be made to last: 100 years (PostgreSQL's timestamps end in 294276).
pub const MAX_EXPIRY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How often, at most, a broker writes a token's last use.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// Most entries the cache holds; past that it starts over, so that a flood of made-up tokens
/// cannot grow it without bound.
const CACHE_CAPACITY: usize = 10_000;

/// Who is asking: a token, or anyone while auth is off.
#[derive(Debug, Clone)]
pub enum Principal {
    /// Auth is off (no token exists): every request may do everything, as before auth.
    Anyone,
    Token(Arc<TokenDocument>),
}

impl Principal {
    /// The token's id, recorded on the leases it claims; None for anyone.
    pub fn token_id(&self) -> Option<i64> {
        match self {
            Self::Anyone => None,
            Self::Token(token) => Some(token.id),
        }
    }

    pub fn role(&self) -> Option<Role> {
        match self {
            Self::Anyone => None,
            Self::Token(token) => Some(token.role),
        }
    }

    /// The tenants this principal is confined to; None: every tenant.
    pub fn tenants(&self) -> Option<&[String]> {
        match self {
            Self::Token(token) if token.role == Role::Producer => token.tenants.as_deref(),
            _ => None,
        }
    }

    /// Whether it may touch `tenant`'s jobs.
    pub fn may_use_tenant(&self, tenant: &str) -> bool {
        self.tenants().is_none_or(|tenants| tenants.iter().any(|t| t == tenant))
    }

    /// Whether it may claim `service`'s items.
    pub fn may_claim(&self, service: &str) -> bool {
        match self {
            Self::Token(token) if token.role == Role::Worker => {
                token.services.as_ref().is_none_or(|services| services.iter().any(|s| s == service))
            }
            _ => true,
        }
    }

    /// The token that a worker's reports must come from to apply: a worker token reports
    /// only on what it claimed itself; an admin (or anyone, without auth) on any item.
    pub fn reporting_token(&self) -> Option<i64> {
        match self {
            Self::Token(token) if token.role == Role::Worker => Some(token.id),
            _ => None,
        }
    }
}

/// Why a request's token was refused (401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Missing,
    Malformed,
    Unknown,
    Expired,
    Revoked,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => "this broker requires a token: send Authorization: Bearer <token>",
            Self::Malformed => "the Authorization header is not \"Bearer <token>\"",
            Self::Unknown => "the token is not known",
            Self::Expired => "the token has expired",
            Self::Revoked => "the token was revoked",
        }
    }
}

/// A new token: 256 random bits, as `fw_` and 64 hex digits.
pub fn generate() -> Result<String, BrokerError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|error| {
        BrokerError::Unavailable(format!("the operating system gave no random bytes: {error}"))
    })?;
    let mut token = String::with_capacity(PREFIX.len() + 64);
    token.push_str(PREFIX);
    for byte in bytes {
        token.push_str(&format!("{byte:02x}"));
    }
    Ok(token)
}

/// SHA-256 of a token: all the database and the cache ever hold of it.
pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// What the cache knows of one hash.
struct Cached {
    fetched: Instant,
    /// None: no such token.
    token: Option<Arc<TokenDocument>>,
}

/// What a new token is to be.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub name: Option<String>,
    pub role: Role,
    pub tenants: Option<Vec<String>>,
    pub services: Option<Vec<String>>,
    pub expires_in: Option<Duration>,
}

/// Checks tokens for the HTTP layer and manages them for the token routes. Cheap to clone.
#[derive(Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    ttl: Duration,
    /// Set once auth is on; it never goes off while the broker runs.
    on: AtomicBool,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
    /// When this broker last wrote each token's last use.
    touched: Mutex<HashMap<i64, Instant>>,
}

impl Authenticator {
    /// Ensures the bootstrap admin token (`admin_token`, from FAIRWAY_ADMIN_TOKEN) is in the
    /// table, and finds out whether auth is on.
    pub async fn start(
        pool: Pool,
        ttl: Duration,
        admin_token: Option<&str>,
    ) -> Result<Self, BrokerError> {
        if let Some(token) = admin_token {
            ensure_admin_token(&pool, token).await?;
        }
        let authenticator = Self {
            inner: Arc::new(Inner {
                pool,
                ttl,
                on: AtomicBool::new(admin_token.is_some()),
                cache: Mutex::new(HashMap::new()),
                touched: Mutex::new(HashMap::new()),
            }),
        };
        authenticator.refresh().await?;
        Ok(authenticator)
    }

    /// Whether requests need a token.
    pub fn is_on(&self) -> bool {
        self.inner.on.load(Ordering::Relaxed)
    }

    /// How long a token looked up stays trusted: revocation takes effect within this.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Turns auth on if the database now holds a token, and forgets stale cache entries. The
    /// broker runs it every --auth-cache-ttl.
    pub async fn refresh(&self) -> Result<(), BrokerError> {
        if !self.is_on() {
            let client = self.inner.pool.get().await?;
            if sql::fetch_one(&client, &TokensExist {}).await?.exists {
                self.turn_on();
            }
        }
        let ttl = self.inner.ttl;
        let mut cache = self.inner.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.retain(|_, cached| cached.fetched.elapsed() < ttl);
        Ok(())
    }

    fn turn_on(&self) {
        if !self.inner.on.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "a token exists: auth is on, and every request but the probes needs one"
            );
        }
    }

    /// The live token behind `presented`, or why it is refused. Looked up in the database at
    /// most once per --auth-cache-ttl per token; errors only when the database is out of
    /// reach.
    pub async fn authenticate(
        &self,
        presented: &str,
    ) -> Result<Result<Arc<TokenDocument>, Refusal>, BrokerError> {
        let digest = hash(presented);
        let cached = {
            let cache = self.inner.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            cache
                .get(&digest)
                .filter(|cached| cached.fetched.elapsed() < self.inner.ttl)
                .map(|cached| cached.token.clone())
        };
        let token = match cached {
            Some(token) => token,
            None => {
                let token = self.look_up(&digest).await?;
                let mut cache =
                    self.inner.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if cache.len() >= CACHE_CAPACITY {
                    cache.clear();
                }
                cache.insert(digest, Cached { fetched: Instant::now(), token: token.clone() });
                token
            }
        };
        let Some(token) = token else { return Ok(Err(Refusal::Unknown)) };
        if token.revoked_at.is_some() {
            return Ok(Err(Refusal::Revoked));
        }
        if token.expires_at.is_some_and(|at| at <= Utc::now()) {
            return Ok(Err(Refusal::Expired));
        }
        self.touch(token.id);
        Ok(Ok(token))
    }

    /// The token whose hash is `digest`, compared in constant time once found.
    async fn look_up(&self, digest: &[u8; 32]) -> Result<Option<Arc<TokenDocument>>, BrokerError> {
        let client = self.inner.pool.get().await?;
        let find = FindToken { hash: digest.as_slice() };
        let Some(TokenRow { token, hash }) = sql::fetch_opt(&client, &find).await? else {
            return Ok(None);
        };
        if !bool::from(hash.as_slice().ct_eq(digest.as_slice())) {
            return Ok(None);
        }
        Ok(Some(Arc::new(token)))
    }

    /// Writes the token's last use, in the background, if this broker has not in a minute.
    fn touch(&self, id: i64) {
        {
            let mut touched =
                self.inner.touched.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if touched.get(&id).is_some_and(|at| at.elapsed() < TOUCH_EVERY) {
                return;
            }
            touched.insert(id, Instant::now());
        }
        let pool = self.inner.pool.clone();
        tokio::spawn(async move {
            let outcome = async {
                let client = pool.get().await?;
                sql::run(&client, &TouchToken { id }).await?;
                Ok::<_, BrokerError>(())
            };
            if let Err(error) = outcome.await {
                tracing::warn!(%error, token = id, "recording a token's last use failed");
            }
        });
    }

    /// Makes a token; returns it as stored and its secret, which exists nowhere else.
    pub async fn create(&self, new: NewToken) -> Result<(TokenDocument, String), BrokerError> {
        let NewToken { name, role, tenants, services, expires_in } = new;
        if tenants.is_some() && role != Role::Producer {
            return Err(BrokerError::invalid(
                "invalid_token_scope",
                "only a producer token takes tenants",
            ));
        }
        if services.is_some() && role != Role::Worker {
            return Err(BrokerError::invalid(
                "invalid_token_scope",
                "only a worker token takes services",
            ));
        }
        let tenants = tenants
            .map(|names| normalise(names, |name| Ok(TenantName::parse(name)?.as_str().to_owned())))
            .transpose()?;
        let services = services
            .map(|names| normalise(names, |name| Ok(ServiceName::parse(name)?.as_str().to_owned())))
            .transpose()?;
        let secret = generate()?;
        let digest = hash(&secret);
        let name = match name {
            Some(name) => valid_name(name)?,
            None => format!("{}-{}", role.as_str(), &hex(&digest)[..8]),
        };
        let expires_ms: Option<i64> = match expires_in {
            Some(duration) if duration.is_zero() => {
                return Err(BrokerError::invalid(
                    "invalid_token_expiry",
                    "a token's expiry must be in the future",
                ))
            }
            Some(duration) if duration > MAX_EXPIRY => {
                return Err(BrokerError::invalid(
                    "invalid_token_expiry",
                    "a token lasts at most 100 years; leave the expiry out for a token that lasts until revoked",
                ))
            }
            Some(duration) => Some(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)),
            None => None,
        };
        let client = self.inner.pool.get().await?;
        let insert = InsertToken {
            name: &name,
            role: role.as_str(),
            tenants: tenants.as_deref(),
            services: services.as_deref(),
            hash: digest.as_slice(),
            expires_in_millis: expires_ms,
        };
        let token = match sql::fetch_opt(&client, &insert).await? {
            Some(token) => token,
            None => {
                return Err(BrokerError::conflict(
                    "token_name_taken",
                    format!(
                        "a live token is already named {name:?}; revoke it or choose another name"
                    ),
                ))
            }
        };
        self.turn_on();
        Ok((token, secret))
    }

    /// Every token, revoked ones too, oldest first; never a secret.
    pub async fn list(&self) -> Result<Vec<TokenDocument>, BrokerError> {
        let client = self.inner.pool.get().await?;
        Ok(sql::fetch_all(&client, &ListTokens {}).await?)
    }

    /// Revokes token `id` (already revoked: as it was). Every broker refuses it within
    /// --auth-cache-ttl; this one at once.
    pub async fn revoke(&self, id: i64) -> Result<TokenDocument, BrokerError> {
        let client = self.inner.pool.get().await?;
        let Some(token) = sql::fetch_opt(&client, &RevokeToken { id }).await? else {
            return Err(BrokerError::not_found("token_not_found", format!("no token {id}")));
        };
        self.inner.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
        Ok(token)
    }
}

/// Each name checked and made canonical, in order, once each; at least one.
fn normalise(
    names: Vec<String>,
    check: impl Fn(&str) -> Result<String, BrokerError>,
) -> Result<Vec<String>, BrokerError> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in &names {
        let name = check(name)?;
        if !out.contains(&name) {
            out.push(name);
        }
    }
    if out.is_empty() {
        return Err(BrokerError::invalid(
            "invalid_token_scope",
            "a scope names at least one tenant or service; leave it out for all",
        ));
    }
    Ok(out)
}

fn valid_name(name: String) -> Result<String, BrokerError> {
    if name.is_empty() || name.chars().count() > 255 || name.chars().any(char::is_control) {
        return Err(BrokerError::invalid(
            "invalid_token_name",
            "a token's name is 1 to 255 characters, none of them control characters",
        ));
    }
    Ok(name)
}

/// Puts FAIRWAY_ADMIN_TOKEN's hash in the table unless it is there (revoked included: a
/// revoked bootstrap token stays revoked; change the Secret to replace it).
async fn ensure_admin_token(pool: &Pool, token: &str) -> Result<(), BrokerError> {
    let digest = hash(token);
    let name = format!("bootstrap-admin-{}", &hex(&digest)[..8]);
    let client = pool.get().await?;
    let ensure = EnsureAdminToken { name: &name, hash: digest.as_slice() };
    let inserted = sql::run(&client, &ensure).await?;
    if inserted > 0 {
        tracing::info!(name, "stored the hash of FAIRWAY_ADMIN_TOKEN as an admin token");
    }
    Ok(())
}

/// Whether the database holds any token, and so has auth on, read without changing anything:
/// for a broker that must know before its migrations run. A database the migrations have not
/// reached holds none.
pub async fn tokens_stored(pool: &Pool) -> Result<bool, BrokerError> {
    let client = pool.get().await?;
    if !sql::fetch_one(&client, &TokensTableExists {}).await?.exists {
        return Ok(false);
    }
    Ok(sql::fetch_one(&client, &TokensExist {}).await?.exists)
}

/// Refuses a FAIRWAY_ADMIN_TOKEN too short to be a secret.
pub fn check_admin_token(token: &str) -> Result<(), String> {
    if token.len() < MIN_ADMIN_TOKEN_LEN
        || token.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "FAIRWAY_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_LEN} characters with no spaces; \
             make one with: head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"
        ));
    }
    Ok(())
}

/// The token cache's upkeep: `serve` refreshes it every --auth-cache-ttl.
impl Upkeep for Authenticator {
    const NAME: &'static str = "token_cache_refresh";
    const WHAT: &'static str = "refreshing the token cache";

    fn interval(&self) -> Duration {
        self.ttl()
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        self.refresh().await
    }
}
