//! `fairway chaos --soak`: the fault suite's load without its faults, for `--duration`,
//! sampling every broker's resident memory and the database's table and index sizes every
//! 10 s into `soak.csv`. It passes when no broker's memory grew by 10 % or more over the last
//! half, and the fair order's tables stayed within their bound (see `fair_order_bound`).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::load::Load;
use super::{item_totals, Brokers, ChaosError, Drive, DATABASE, POLL};
use crate::args::ChaosArgs;
use crate::sql::{self, RELATION_SIZES};
use fairway_broker::db;
use fairway_devdb::EmbeddedPostgres;

const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// An asynchronous job this often: steady load that leaves the shared machine some room.
const SOAK_PACE: Duration = Duration::from_millis(400);
/// The tables that hold the fair order: rows per active user, job step, tenant and actor.
const FAIR_ORDER: [&str; 9] = [
    "users",
    "user_work",
    "service_users",
    "actor_queues",
    "tenant_queues",
    "tenant_running_changes",
    "claimable_steps",
    "strategy_running",
    "strategy_running_changes",
];
/// The other tables sampled: the backlog, which retention bounds.
const OTHERS: [&str; 4] = ["jobs", "job_steps", "work_items", "queriers"];
/// Most RSS growth over the last half that passes.
const RSS_GROWTH_LIMIT: f64 = 0.10;
/// Longest wait, after the load stops, for the work in flight to finish.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Serialize)]
struct Sample {
    at_s: f64,
    rss_kib: Vec<u64>,
    /// (table, table bytes, index bytes), in table order.
    sizes: Vec<(String, i64, i64)>,
}

impl Sample {
    fn fair_order_bytes(&self) -> i64 {
        self.sizes
            .iter()
            .filter(|(table, ..)| FAIR_ORDER.contains(&table.as_str()))
            .map(|(_, table, index)| table + index)
            .sum()
    }
}

#[derive(Debug, Serialize)]
struct Summary {
    duration_s: f64,
    samples: usize,
    rss_mid_kib: Vec<u64>,
    rss_end_kib: Vec<u64>,
    rss_growth_last_half: Vec<f64>,
    fair_order_first_half_max_bytes: i64,
    fair_order_second_half_max_bytes: i64,
    fair_order_bound_bytes: i64,
    work_items_end_bytes: i64,
    jobs: usize,
    passed: bool,
}

/// The fair order's tables hold a row per active user, job step, tenant and actor, which
/// steady load keeps at a steady number, and the brokers vacuum them every 2 s, so freed
/// space is reused: over the second half they must stay within twice their largest size in
/// the first half, plus 1 MiB for the page-sized steps of small tables.
fn fair_order_bound(first_half_max: i64) -> i64 {
    2 * first_half_max + 1024 * 1024
}

pub async fn run(args: &ChaosArgs, server: &EmbeddedPostgres) -> Result<(), ChaosError> {
    // Finished jobs are pruned after a minute, so that the backlog is steady too.
    let extra = ["--retention", "1m", "--prune-interval", "10s"].map(str::to_owned);
    let mut brokers =
        Brokers::start(args, server, server.connection_string(DATABASE), &extra).await?;
    let config = fairway_devdb::parse_config(&server.connection_string(DATABASE))?;
    let pool = db::pool::connect(&config, 2)?;
    let load = Load::new(brokers.clients.clone());
    let drive = Drive::start(&brokers, args, 0)?;
    let producers = load.start(SOAK_PACE);
    let tables: Vec<String> = FAIR_ORDER.iter().chain(&OTHERS).map(|&t| t.to_owned()).collect();
    let csv_path = args.out.join("soak.csv");
    let mut csv = String::new();
    let mut samples = Vec::new();
    let started = Instant::now();
    let mut ticker = tokio::time::interval(SAMPLE_EVERY);
    println!(
        "soak: 3 brokers, {} workers, {}; sampling every {} s into {}",
        args.workers,
        humantime::format_duration(args.duration),
        SAMPLE_EVERY.as_secs(),
        csv_path.display()
    );
    while started.elapsed() <= args.duration {
        ticker.tick().await;
        let sample = sample(&brokers, &pool, &tables, started).await?;
        if samples.is_empty() {
            csv_header(&mut csv, &sample);
        }
        csv_line(&mut csv, &sample);
        std::fs::write(&csv_path, &csv)?;
        println!(
            "  {:>6.0} s  rss {:?} KiB  fair order {} KiB",
            sample.at_s,
            sample.rss_kib,
            sample.fair_order_bytes() / 1024
        );
        samples.push(sample);
    }
    load.stop.cancel();
    for producer in producers {
        let _ = producer.await;
    }
    let drained = drain(&pool).await;
    let record = drive.finish().await?;
    let consistency = brokers.clients[0].consistency().await?;
    brokers.stop().await;
    pool.close();

    let mut failures = Vec::new();
    if !drained {
        failures.push("work was still unfinished after the load stopped".to_owned());
    }
    if !consistency.consistent {
        failures.push(format!("/admin/consistency: {:?}", consistency.mismatches));
    }
    let summary = summarise(&samples, started.elapsed(), load.tracked().len());
    if summary.rss_growth_last_half.iter().any(|growth| *growth >= RSS_GROWTH_LIMIT) {
        failures.push(format!("RSS grew over the last half: {:?}", summary.rss_growth_last_half));
    }
    if summary.fair_order_second_half_max_bytes > summary.fair_order_bound_bytes {
        failures.push(format!(
            "the fair order's tables reached {} bytes, past their bound of {}",
            summary.fair_order_second_half_max_bytes, summary.fair_order_bound_bytes
        ));
    }
    let failed_answers =
        record.refused.iter().filter(|refusal| refusal.status >= 500 || refusal.status == 0);
    let failed_answers = failed_answers.count();
    if failed_answers > 0 {
        failures.push(format!("{failed_answers} requests failed or got a 5xx without any fault"));
    }
    std::fs::write(args.out.join("soak-summary.json"), serde_json::to_vec_pretty(&summary)?)?;
    println!(
        "soak summary: {} samples over {:.0} s, {} jobs, {} claims",
        summary.samples,
        summary.duration_s,
        summary.jobs,
        record.claims.len()
    );
    for (broker, growth) in summary.rss_growth_last_half.iter().enumerate() {
        println!(
            "  broker {broker}: RSS {} KiB at half, {} KiB at the end: {:+.1} %",
            summary.rss_mid_kib[broker],
            summary.rss_end_kib[broker],
            growth * 100.0
        );
    }
    println!(
        "  fair order tables: at most {} KiB in the first half, {} KiB in the second (bound {} KiB)",
        summary.fair_order_first_half_max_bytes / 1024,
        summary.fair_order_second_half_max_bytes / 1024,
        summary.fair_order_bound_bytes / 1024
    );
    println!("  work_items at the end: {} KiB", summary.work_items_end_bytes / 1024);
    if failures.is_empty() {
        println!("soak: passed");
        Ok(())
    } else {
        Err(ChaosError::Failed(failures))
    }
}

async fn sample(
    brokers: &Brokers,
    pool: &deadpool_postgres::Pool,
    tables: &[String],
    started: Instant,
) -> Result<Sample, ChaosError> {
    let rss_kib = (0..brokers.clients.len()).map(|index| rss_kib(brokers.pid(index))).collect();
    let client = pool.get().await?;
    let rows = sql::query(&client, RELATION_SIZES, &[&tables]).await?;
    let sizes = rows
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    Ok(Sample { at_s: started.elapsed().as_secs_f64(), rss_kib, sizes })
}

/// A process's resident memory, from /proc; 0 when it cannot be read.
fn rss_kib(pid: Option<u32>) -> u64 {
    let Some(pid) = pid else { return 0 };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse().ok())
        })
        .unwrap_or(0)
}

fn csv_header(csv: &mut String, sample: &Sample) {
    csv.push_str("at_s");
    for broker in 0..sample.rss_kib.len() {
        let _ = write!(csv, ",broker{broker}_rss_kib");
    }
    for (table, ..) in &sample.sizes {
        let _ = write!(csv, ",{table}_bytes,{table}_index_bytes");
    }
    csv.push('\n');
}

fn csv_line(csv: &mut String, sample: &Sample) {
    let _ = write!(csv, "{:.0}", sample.at_s);
    for rss in &sample.rss_kib {
        let _ = write!(csv, ",{rss}");
    }
    for (_, table, index) in &sample.sizes {
        let _ = write!(csv, ",{table},{index}");
    }
    csv.push('\n');
}

/// Waits until every item left in the database has succeeded.
async fn drain(pool: &deadpool_postgres::Pool) -> bool {
    let started = Instant::now();
    while started.elapsed() < DRAIN_LIMIT {
        if matches!(item_totals(pool).await, Ok((items, successful, _)) if items == successful) {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    false
}

fn summarise(samples: &[Sample], duration: Duration, jobs: usize) -> Summary {
    let half = samples.len() / 2;
    let (first, second) = samples.split_at(half);
    let mid = second.first().or(samples.last());
    let end = samples.last();
    let rss = |sample: Option<&Sample>| sample.map(|s| s.rss_kib.clone()).unwrap_or_default();
    let (rss_mid_kib, rss_end_kib) = (rss(mid), rss(end));
    let rss_growth_last_half = rss_mid_kib
        .iter()
        .zip(&rss_end_kib)
        .map(|(&mid, &end)| if mid == 0 { 0.0 } else { end as f64 / mid as f64 - 1.0 })
        .collect();
    let max = |part: &[Sample]| part.iter().map(Sample::fair_order_bytes).max().unwrap_or(0);
    let first_max = max(first);
    let work_items_end_bytes = end
        .and_then(|s| s.sizes.iter().find(|(table, ..)| table == "work_items"))
        .map(|(_, table, index)| table + index)
        .unwrap_or(0);
    let bound = fair_order_bound(first_max);
    let second_max = max(second);
    let growth_ok = |g: &Vec<f64>| g.iter().all(|growth| *growth < RSS_GROWTH_LIMIT);
    Summary {
        duration_s: duration.as_secs_f64(),
        samples: samples.len(),
        passed: growth_ok(&rss_growth_last_half) && second_max <= bound,
        rss_mid_kib,
        rss_end_kib,
        rss_growth_last_half,
        fair_order_first_half_max_bytes: first_max,
        fair_order_second_half_max_bytes: second_max,
        fair_order_bound_bytes: bound,
        work_items_end_bytes,
        jobs,
    }
}
