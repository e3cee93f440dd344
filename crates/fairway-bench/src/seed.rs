//! Seeds the benchmark database in bulk, and resets it between claim paths.

use crate::sql::{HARMONY_SCHEMA, RESET_ITEMS, SEED_COUNTERS, SEED_METADATA, SEED_OTHER_SERVICES};
use std::collections::BTreeSet;

use deadpool_postgres::Pool;
use futures_util::pin_mut;
use serde_json::json;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

use super::BenchError;
use crate::sql;
use fairway_api::policy::PolicyChange;
use fairway_broker::statements::policies::SetUserPolicy;

/// The service every seeded item belongs to.
pub const SERVICE: &str = "bench";

/// Ready items each user has in every service besides the benched one (--services-per-user).
const OTHER_SERVICE_ITEMS: i32 = 4;

/// What was seeded: jobs, sorted, and whose user each one is.
pub struct Seeded {
    pub jobs: Vec<Uuid>,
    /// The index of each job's user.
    owners: Vec<usize>,
    /// Ready items seeded per user.
    pub items: Vec<u64>,
    /// Each user's weight: what its share of the items served is divided by.
    pub weights: Vec<u64>,
    /// Whether a user's cap or rate limit decides its share rather than its weight.
    pub held: Vec<bool>,
}

impl Seeded {
    pub fn user_of(&self, job: &Uuid) -> Option<usize> {
        self.jobs.binary_search(job).ok().map(|index| self.owners[index])
    }

    pub fn users(&self) -> usize {
        self.items.len()
    }
}

fn username(index: usize) -> String {
    format!("user-{index:05}")
}

/// User `index`'s policy where the seed has policies: a third weighted 1 to 8, a tenth capped
/// at one item running, and a tenth held to one item a second (burst 2).
fn user_policy(index: usize) -> PolicyChange {
    let weight = (index % 3 == 0).then(|| 1 + (index / 3 % 8) as i32);
    match index % 10 {
        1 => PolicyChange { weight, max_running: Some(1), ..PolicyChange::default() },
        2 => PolicyChange {
            weight,
            rate_per_second: Some(1.0),
            burst: Some(2),
            ..PolicyChange::default()
        },
        _ => PolicyChange { weight, ..PolicyChange::default() },
    }
}

/// The benched service, then bench-2, bench-3 and so on (as seed_other_services.sql names them).
fn service_name(index: usize) -> String {
    if index == 0 {
        SERVICE.to_owned()
    } else {
        format!("{SERVICE}-{}", index + 1)
    }
}

/// How many jobs each user has, and how the users and jobs are dealt over tenants and query
/// components.
#[derive(Debug, Clone, Copy)]
pub struct Partitions {
    pub jobs_per_user: usize,
    pub tenants: usize,
    pub components: usize,
    /// Services each user has ready work in: the benched one, and the rest unclaimed.
    pub services: usize,
    /// Whether the workers claim from every one of the services, each worker from one, rather
    /// than from the benched one alone. The jobs are then dealt over the services in turn, so
    /// each user has work in every service when it has a multiple of `services` jobs.
    pub claim_every_service: bool,
    /// Of the users, the percentage whose jobs are dealt over every service when the workers
    /// claim from every one; the others' jobs all go to one service, the users in turn.
    pub shared_percent: u8,
    /// Whether jobs get metadata and priorities, for the strategy paths.
    pub metadata: bool,
    /// Whether users get policies (`user_policy`): weights, caps and rate limits.
    pub policies: bool,
}

impl Partitions {
    /// User (and job) `index`'s tenant: `default` when there is one, as in most installations.
    fn tenant(self, index: usize) -> String {
        if self.tenants == 1 {
            "default".to_owned()
        } else {
            format!("tenant-{:04}", index % self.tenants)
        }
    }

    /// Job `index`'s service, where `users` users own the jobs in turn.
    fn service(self, index: usize, users: usize) -> String {
        let owner = index % users;
        if !self.claim_every_service {
            SERVICE.to_owned()
        } else if owner * 100 < usize::from(self.shared_percent) * users {
            service_name(index / users % self.services)
        } else {
            service_name(owner % self.services)
        }
    }

    /// The services the workers claim from, worker i from the i-th modulo their number.
    pub fn claimed_services(self) -> Vec<String> {
        let claimed = if self.claim_every_service { self.services } else { 1 };
        (0..claimed).map(service_name).collect()
    }

    fn component(self, index: usize) -> String {
        if self.components == 1 {
            "unknown".to_owned()
        } else {
            format!("component-{:02}", index % self.components)
        }
    }
}

/// `users` users with `jobs_per_user` asynchronous one-step jobs each, and `backlog` ready items
/// split evenly between the jobs, each job's items contiguous as a real submission's are, users
/// dealt over the tenants and jobs over the components; written with COPY, then counters, VACUUM
/// and ANALYZE.
pub async fn seed(
    pool: &Pool,
    users: usize,
    backlog: usize,
    partitions: Partitions,
) -> Result<Seeded, BenchError> {
    let client = pool.get().await?;
    client.batch_execute(HARMONY_SCHEMA).await?;
    // Sorted, so that lookups are a binary search; job j belongs to user j mod users.
    let job_count = users * partitions.jobs_per_user;
    let mut jobs: Vec<Uuid> = (0..job_count).map(|_| Uuid::new_v4()).collect();
    jobs.sort_unstable();
    let owners: Vec<usize> = (0..job_count).map(|job| job % users).collect();
    let names: Vec<String> = (0..users).map(username).collect();
    let tenants: Vec<String> = (0..users).map(|user| partitions.tenant(user)).collect();
    let components: Vec<String> = (0..job_count).map(|job| partitions.component(job)).collect();
    let services: Vec<String> = (0..job_count).map(|job| partitions.service(job, users)).collect();
    client
        .execute(
            "INSERT INTO tenants (tenant) SELECT DISTINCT unnest($1::text[]) ON CONFLICT DO NOTHING",
            &[&tenants],
        )
        .await?;

    copy_rows(
        &client,
        "users (username)",
        &[Type::TEXT],
        names.iter().map(|name| vec![name as &(dyn ToSql + Sync)]),
    )
    .await?;
    let no_actor: Vec<String> = Vec::new();
    copy_rows(
        &client,
        "jobs (job_id, username, is_async, tenant, actor)",
        &[Type::UUID, Type::TEXT, Type::BOOL, Type::TEXT, Type::TEXT_ARRAY],
        (0..job_count).map(|job| {
            let owner = owners[job];
            vec![
                &jobs[job] as &(dyn ToSql + Sync),
                &names[owner],
                &true,
                &tenants[owner],
                &no_actor,
            ]
        }),
    )
    .await?;
    copy_rows(
        &client,
        "job_steps (job_id, step_index, service, aggregate)",
        &[Type::UUID, Type::INT4, Type::TEXT, Type::BOOL],
        jobs.iter()
            .zip(&services)
            .map(|(job, service)| vec![job as &(dyn ToSql + Sync), &0_i32, service, &false]),
    )
    .await?;
    copy_rows(
        &client,
        "user_work (job_id, step_index, component, username, service, is_async, tenant, actor)",
        &[
            Type::UUID,
            Type::INT4,
            Type::TEXT,
            Type::TEXT,
            Type::TEXT,
            Type::BOOL,
            Type::TEXT,
            Type::TEXT_ARRAY,
        ],
        (0..job_count).map(|job| {
            let owner = owners[job];
            vec![
                &jobs[job] as &(dyn ToSql + Sync),
                &0_i32,
                &components[job],
                &names[owner],
                &services[job],
                &true,
                &tenants[owner],
                &no_actor,
            ]
        }),
    )
    .await?;
    // One row per user, service and component its jobs need.
    let queues: BTreeSet<(usize, &String, &String)> =
        (0..job_count).map(|job| (owners[job], &services[job], &components[job])).collect();
    copy_rows(
        &client,
        "service_users (service, component, tenant, username)",
        &[Type::TEXT, Type::TEXT, Type::TEXT, Type::TEXT],
        queues.iter().map(|&(user, service, component)| {
            vec![service as &(dyn ToSql + Sync), component, &tenants[user], &names[user]]
        }),
    )
    .await?;
    let job_items: Vec<usize> = (0..job_count)
        .map(|job| backlog / job_count + usize::from(job < backlog % job_count))
        .collect();
    let mut items = vec![0_u64; users];
    for (job, count) in job_items.iter().enumerate() {
        items[owners[job]] += *count as u64;
    }
    let payload = json!({});
    copy_rows(
        &client,
        "work_items (job_id, step_index, component, payload)",
        &[Type::UUID, Type::INT4, Type::TEXT, Type::JSONB],
        (0..job_count)
            .flat_map(|job| std::iter::repeat_n(job, job_items[job]))
            .map(|job| vec![&jobs[job] as &(dyn ToSql + Sync), &0_i32, &components[job], &payload]),
    )
    .await?;
    if partitions.services > 1 && !partitions.claim_every_service {
        let service_count = i32::try_from(partitions.services).unwrap_or(i32::MAX);
        client.execute(SEED_OTHER_SERVICES, &[&service_count, &OTHER_SERVICE_ITEMS]).await?;
    }
    if partitions.metadata {
        client.batch_execute(SEED_METADATA).await?;
    }
    client.batch_execute(SEED_COUNTERS).await?;
    let (mut weights, mut held) = (vec![1; users], vec![false; users]);
    if partitions.policies {
        // Set as an operator sets them, through the broker's own statement.
        for (index, name) in names.iter().enumerate() {
            let change = user_policy(index);
            if change == PolicyChange::default() {
                continue;
            }
            let set = SetUserPolicy {
                username: name,
                weight: change.weight,
                max_running: change.max_running,
                rate_per_second: change.rate_per_second,
                burst: change.burst,
                tier: change.tier,
            };
            sql::run(&client, &set).await?;
            weights[index] = change.weight.map_or(1, |weight| weight as u64);
            held[index] = change.max_running.is_some() || change.rate_per_second.is_some();
        }
    }
    client.batch_execute("VACUUM ANALYZE").await?;
    settle(&client).await;
    Ok(Seeded { jobs, owners, items, weights, held })
}

async fn copy_rows<'a>(
    client: &tokio_postgres::Client,
    target: &str,
    types: &[Type],
    rows: impl Iterator<Item = Vec<&'a (dyn ToSql + Sync)>>,
) -> Result<(), BenchError> {
    let sink = client.copy_in(&format!("COPY {target} FROM STDIN (FORMAT binary)")).await?;
    let writer = BinaryCopyInWriter::new(sink, types);
    pin_mut!(writer);
    for row in rows {
        writer.as_mut().write(&row).await?;
    }
    writer.finish().await?;
    Ok(())
}

/// Returns the database to its seeded state: every seeded item ready, every counter idle.
pub async fn reset(pool: &Pool) -> Result<(), BenchError> {
    let client = pool.get().await?;
    client.batch_execute(RESET_ITEMS).await?;
    client.batch_execute(SEED_COUNTERS).await?;
    client.batch_execute("VACUUM ANALYZE").await?;
    settle(&client).await;
    Ok(())
}

/// Writes out what seeding or resetting left dirty, so that no path's run shares the disk with
/// flushing the previous step's writes. The first path after a bulk seed of 1,000,000 items
/// (always `fair`) otherwise ran beside the write-back of a few hundred megabytes that the
/// later paths never met. CHECKPOINT needs a superuser or `pg_checkpoint`; without them the
/// run goes on unsettled, with a warning.
async fn settle(client: &tokio_postgres::Client) {
    if let Err(error) = client.batch_execute("CHECKPOINT").await {
        eprintln!(
            "CHECKPOINT failed ({error}); paths may run beside the previous step's write-back"
        );
    }
}
