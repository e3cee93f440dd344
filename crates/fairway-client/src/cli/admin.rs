//! `fairway admin`: tables of what the broker holds, and the few steering actions.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde::Serialize;

use super::{client, CliError};
use crate::args::{
    AdminArgs, AdminCommand, JobCommand, ServiceCommand, TenantCommand, TokenCommand, UserCommand,
};
use crate::JobAction;
use crate::{Client, JobFilter};
use fairway_api::build::VersionDocument;
use fairway_api::model::{JobDocument, JobId, UserWorkRow};
use fairway_api::policy::{ServicePolicyDocument, UserPolicyDocument};
use fairway_api::summary::ServiceSummary;
use fairway_api::tenancy::{QuerierDocument, TenantChange, TenantDocument};
use fairway_api::tokens::TokenDocument;

pub async fn run(args: AdminArgs) -> Result<(), CliError> {
    let json = args.json;
    let outcome = run_command(args).await;
    // With --json a script reads standard output: it gets the API's JSON error there too (the
    // words still go to standard error, and the exit is non-zero).
    if let (true, Err(CliError::Client(crate::ClientError::Api { code, message, .. }))) =
        (json, &outcome)
    {
        println!("{}", serde_json::json!({ "error": { "code": code, "message": message } }));
    }
    outcome
}

async fn run_command(args: AdminArgs) -> Result<(), CliError> {
    let client = client(&args.broker)?;
    let print = Printer { json: args.json };
    match args.command {
        AdminCommand::Services { command: None } => {
            print.list(&client.services().await?, services_table)
        }
        AdminCommand::Services { command: Some(ServiceCommand::Show { service }) } => {
            print.list(&[client.service_policy(&service).await?], policies_table)
        }
        AdminCommand::Services { command: Some(ServiceCommand::Set { service, limits }) } => {
            let policy = client.set_service_policy(&service, &limits.change(None)).await?;
            print.list(&[policy], policies_table)
        }
        AdminCommand::Users { command: None, service, user, limit } => {
            let rows = client.user_work(service.as_deref(), user.as_deref(), limit).await?;
            print.list(&rows, users_table)
        }
        AdminCommand::Users { command: Some(UserCommand::Show { user }), .. } => {
            print.list(&[client.user_policy(&user).await?], user_policies_table)
        }
        AdminCommand::Users { command: Some(UserCommand::Set { user, rank, limits }), .. } => {
            let policy = client.set_user_policy(&user, &limits.change(Some(&rank))).await?;
            print.list(&[policy], user_policies_table)
        }
        AdminCommand::Jobs { command } => {
            let job = match command {
                JobCommand::Bulk {
                    action,
                    user,
                    tenant,
                    status,
                    service,
                    submitted_before,
                    dry_run,
                } => {
                    let filter =
                        JobFilter { user, tenant, status, service, submitted_before, dry_run };
                    let answer = client.bulk(action.as_str(), &filter).await?;
                    if print.json {
                        return print.json(&answer);
                    }
                    let matched = counted(answer.matched, "job");
                    if dry_run {
                        println!("matches {matched}; a dry run changes none");
                    } else {
                        println!("matched {matched}, changed {}", answer.changed);
                    }
                    return Ok(());
                }
                JobCommand::Show { job_id } => client.job(JobId(job_id)).await?,
                JobCommand::Pause { job_id } => {
                    client.steer(JobId(job_id), JobAction::Pause).await?
                }
                JobCommand::Resume { job_id } => {
                    client.steer(JobId(job_id), JobAction::Resume).await?
                }
                JobCommand::Cancel { job_id } => {
                    client.steer(JobId(job_id), JobAction::Cancel).await?
                }
                JobCommand::Retry { job_id } => {
                    let retried = client.retry(JobId(job_id)).await?;
                    if print.json {
                        return print.json(&retried);
                    }
                    println!("retried {}", counted(retried.retried, "item"));
                    retried.job
                }
            };
            print.one(&job, job_table)
        }
        AdminCommand::Tenants { command: None } => {
            print.list(&client.tenants().await?, tenants_table)
        }
        AdminCommand::Tenants { command: Some(TenantCommand::Show { tenant }) } => {
            print.list(&[client.tenant(&tenant).await?], tenants_table)
        }
        AdminCommand::Tenants {
            command:
                Some(TenantCommand::Set { tenant, max_queriers, max_outstanding, rank, limits }),
        } => {
            let policy = limits.change(Some(&rank));
            let change = TenantChange { max_queriers, max_outstanding, policy };
            print.list(&[client.set_tenant(&tenant, &change).await?], tenants_table)
        }
        AdminCommand::Queriers => print.list(&client.queriers().await?, queriers_table),
        AdminCommand::Version => print.one(&client.version().await?, version_table),
        AdminCommand::Tokens { command } => tokens(&client, &print, command).await,
        AdminCommand::Consistency => {
            let recount = client.consistency().await?;
            if args.json {
                print.json(&serde_json::json!({
                    "consistent": recount.consistent,
                    "mismatches": recount.mismatches,
                }))?;
            } else if recount.consistent {
                println!("consistent: every counter equals its recount");
            } else {
                let mut table = table(&["table", "key", "recorded", "actual"]);
                for mismatch in &recount.mismatches {
                    table.add_row(vec![
                        mismatch.table.clone(),
                        mismatch.key.to_string(),
                        mismatch.recorded.to_string(),
                        mismatch.actual.to_string(),
                    ]);
                }
                println!("{table}");
            }
            if recount.consistent {
                Ok(())
            } else {
                Err(CliError::Found(format!(
                    "{} counters differ from their recount",
                    recount.mismatches.len()
                )))
            }
        }
    }
}

/// `fairway admin tokens`: a made token is printed once, alone on the last line, after what
/// is stored of it; listings never hold a secret.
async fn tokens(client: &Client, print: &Printer, command: TokenCommand) -> Result<(), CliError> {
    match command {
        TokenCommand::Create { role, tenants, services, name, expires } => {
            let mut body = serde_json::json!({ "role": role });
            if !tenants.is_empty() {
                body["tenants"] = serde_json::json!(tenants);
            }
            if !services.is_empty() {
                body["services"] = serde_json::json!(services);
            }
            if let Some(name) = name {
                body["name"] = serde_json::json!(name);
            }
            if let Some(expires) = expires {
                body["expires_in_seconds"] = serde_json::json!(expires.as_secs().max(1));
            }
            let created = client.create_token(&body).await?;
            if print.json {
                print.json(
                    &serde_json::json!({ "token": created.token, "details": created.details }),
                )
            } else {
                println!("{}", tokens_table(std::slice::from_ref(&created.details)));
                println!("The token, shown this once (only its hash is stored):");
                println!("{}", created.token);
                Ok(())
            }
        }
        TokenCommand::List => print.list(&client.tokens().await?, tokens_table),
        TokenCommand::Revoke { token } => {
            let id = match token.parse::<i64>() {
                Ok(id) => id,
                Err(_) => {
                    let now = chrono::Utc::now();
                    client
                        .tokens()
                        .await?
                        .into_iter()
                        .find(|listed| listed.name == token && listed.is_live(now))
                        .map(|listed| listed.id)
                        .ok_or_else(|| CliError::Input(format!("no live token named {token:?}")))?
                }
            };
            let revoked = client.revoke_token(id).await?;
            print.list(&[revoked], tokens_table)
        }
    }
}

/// Prints documents as a table, or as the API's JSON with `--json`.
struct Printer {
    json: bool,
}

impl Printer {
    fn list<T: Serialize>(&self, rows: &[T], table: fn(&[T]) -> Table) -> Result<(), CliError> {
        if self.json {
            return self.json(&rows);
        }
        println!("{}", table(rows));
        Ok(())
    }

    fn one<T: Serialize>(&self, document: &T, table: fn(&T) -> Table) -> Result<(), CliError> {
        if self.json {
            return self.json(document);
        }
        println!("{}", table(document));
        Ok(())
    }

    fn json<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), CliError> {
        let text = serde_json::to_string_pretty(value)
            .map_err(|error| CliError::Input(format!("cannot print the answer: {error}")))?;
        println!("{text}");
        Ok(())
    }
}

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(header.to_vec());
    table
}

fn when(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map_or_else(|| "never".to_owned(), |at| at.format("%Y-%m-%d %H:%M:%S").to_string())
}

fn services_table(services: &[ServiceSummary]) -> Table {
    let mut table = table(&[
        "service",
        "ready",
        "scheduled",
        "running",
        "paused",
        "oldest ready",
        "active users",
        "claims/s",
        "waiting workers",
        "last asked",
    ]);
    for service in services {
        let oldest = service
            .oldest_ready_age_seconds
            .map_or_else(|| "–".to_owned(), |seconds| format!("{seconds:.0} s"));
        table.add_row(vec![
            service.service.clone(),
            service.ready.to_string(),
            service.scheduled.to_string(),
            service.running.to_string(),
            service.paused.to_string(),
            oldest,
            service.active_users.to_string(),
            format!("{:.1}", service.claims_per_second),
            service.waiting_workers.to_string(),
            when(service.last_asked),
        ]);
    }
    table
}

fn users_table(rows: &[UserWorkRow]) -> Table {
    let mut table = table(&[
        "user",
        "tenant",
        "service",
        "component",
        "job",
        "step",
        "sync",
        "paused",
        "ready",
        "running",
        "last worked",
    ]);
    for row in rows {
        table.add_row(vec![
            row.user.clone(),
            row.tenant.clone(),
            row.service.clone(),
            row.component.clone(),
            row.job_id.0.to_string(),
            row.step.to_string(),
            (!row.is_async).to_string(),
            row.paused.to_string(),
            row.ready_count.to_string(),
            row.running_count.to_string(),
            when(row.last_worked),
        ]);
    }
    table
}

fn job_table(job: &JobDocument) -> Table {
    let mut table = table(&[
        "step",
        "service",
        "total",
        "ready",
        "scheduled",
        "running",
        "successful",
        "failed",
        "canceled",
    ]);
    for (index, step) in job.steps.iter().enumerate() {
        table.add_row(vec![
            index.to_string(),
            step.service.clone(),
            step.total.to_string(),
            step.ready.to_string(),
            step.scheduled.to_string(),
            step.running.to_string(),
            step.successful.to_string(),
            step.failed.to_string(),
            step.canceled.to_string(),
        ]);
    }
    println!(
        "job {}  user {}  tenant {}  status {}  progress {}%",
        job.job_id.0,
        job.user,
        job.tenant,
        job.status.as_str(),
        job.progress
    );
    table
}

/// A cap or a rate as a table shows it: "none" for 0.
fn or_none<T: PartialOrd + Default + ToString>(value: T) -> String {
    if value > T::default() {
        value.to_string()
    } else {
        "none".to_owned()
    }
}

/// Whether claims pass the key over now, and why.
fn held_back(at_cap: bool, throttled_until: Option<chrono::DateTime<chrono::Utc>>) -> String {
    match (at_cap, throttled_until) {
        (true, _) => "at cap".to_owned(),
        (false, Some(due)) => format!("rate-limited until {}", due.format("%H:%M:%S%.3f")),
        (false, None) => "served".to_owned(),
    }
}

fn tenants_table(tenants: &[TenantDocument]) -> Table {
    let mut table = table(&[
        "tenant",
        "weight",
        "tier",
        "max running",
        "rate /s",
        "burst",
        "running",
        "state",
        "max queriers",
        "max outstanding",
        "outstanding",
        "queriers",
    ]);
    for tenant in tenants {
        let queriers = if tenant.sharded { tenant.queriers.join(", ") } else { "all".to_owned() };
        table.add_row(vec![
            tenant.tenant.clone(),
            tenant.weight.to_string(),
            tenant.tier.to_string(),
            or_none(tenant.max_running),
            or_none(tenant.rate_per_second),
            tenant.burst.to_string(),
            tenant.running.to_string(),
            held_back(tenant.at_cap, tenant.throttled_until),
            tenant.max_queriers.to_string(),
            tenant.max_outstanding.to_string(),
            tenant.outstanding.to_string(),
            queriers,
        ]);
    }
    table
}

fn user_policies_table(policies: &[UserPolicyDocument]) -> Table {
    let mut table =
        table(&["user", "weight", "tier", "max running", "rate /s", "burst", "running", "state"]);
    for policy in policies {
        table.add_row(vec![
            policy.user.clone(),
            policy.weight.to_string(),
            policy.tier.to_string(),
            or_none(policy.max_running),
            or_none(policy.rate_per_second),
            policy.burst.to_string(),
            policy.running.to_string(),
            held_back(policy.at_cap, policy.throttled_until),
        ]);
    }
    table
}

fn policies_table(policies: &[ServicePolicyDocument]) -> Table {
    let mut table = table(&["service", "max running", "rate /s", "burst", "running"]);
    for policy in policies {
        table.add_row(vec![
            policy.service.clone(),
            or_none(policy.max_running),
            or_none(policy.rate_per_second),
            policy.burst.to_string(),
            policy.running.to_string(),
        ]);
    }
    table
}

fn version_table(version: &VersionDocument) -> Table {
    let mut table = table(&["of", "release", "functions", "schema migration", "last used"]);
    table.add_row(vec![
        "broker".to_owned(),
        version.version.clone(),
        format!("{} (revision {})", version.functions_schema, version.functions_revision),
        version.schema_migration.clone(),
        "–".to_owned(),
    ]);
    let database = &version.database;
    table.add_row(vec![
        "database".to_owned(),
        "–".to_owned(),
        "–".to_owned(),
        database.schema_migration.clone().unwrap_or_else(|| "none".to_owned()),
        "–".to_owned(),
    ]);
    for set in &database.function_sets {
        let triggers = if set.owns_triggers { ", triggers" } else { "" };
        table.add_row(vec![
            "function set".to_owned(),
            set.version.clone(),
            format!("{} (revision {}{triggers})", set.schema, set.revision),
            "–".to_owned(),
            when(Some(set.last_used_at)),
        ]);
    }
    table
}

fn queriers_table(queriers: &[QuerierDocument]) -> Table {
    let mut table = table(&["querier", "state", "leases", "last request", "tenants"]);
    for querier in queriers {
        table.add_row(vec![
            querier.querier.clone(),
            querier.state.clone(),
            querier.leases.to_string(),
            when(Some(querier.last_request_at)),
            querier.tenants.join(", "),
        ]);
    }
    table
}

fn tokens_table(tokens: &[TokenDocument]) -> Table {
    let mut table =
        table(&["id", "name", "role", "scope", "created", "expires", "revoked", "last used"]);
    for token in tokens {
        let scope = match (&token.tenants, &token.services) {
            (Some(tenants), _) => format!("tenants: {}", tenants.join(", ")),
            (_, Some(services)) => format!("services: {}", services.join(", ")),
            _ => "all".to_owned(),
        };
        let expires = token.expires_at.map_or_else(|| "never".to_owned(), |at| when(Some(at)));
        let revoked = token.revoked_at.map_or_else(|| "–".to_owned(), |at| when(Some(at)));
        table.add_row(vec![
            token.id.to_string(),
            token.name.clone(),
            token.role.as_str().to_owned(),
            scope,
            when(Some(token.created_at)),
            expires,
            revoked,
            when(token.last_used_at),
        ]);
    }
    table
}

/// "1 job", "2 jobs".
fn counted(count: impl Into<i128> + Copy, noun: &str) -> String {
    let count: i128 = count.into();
    format!("{count} {noun}{}", if count == 1 { "" } else { "s" })
}
