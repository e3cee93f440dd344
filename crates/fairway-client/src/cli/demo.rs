//! `fairway demo`: fair sharing, shown. Worker pods (`fairway worker` processes) serve one
//! service; alice submits a backlog, bob arrives a third of the way in and carol two thirds;
//! every quarter second the demo reads who holds the workers (`/admin/shares`) and at the end
//! draws each user's share over time as an SVG line chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::process::{Child, Command};

use super::{client, CliError};
use crate::args::DemoArgs;
use crate::{Client, JobAction};

const SERVICE: &str = "demo";
const USERS: [&str; 3] = ["alice", "bob", "carol"];
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Samples averaged into each point of the chart, so that single claims do not jitter it.
const SMOOTHING: usize = 4;
const COLOURS: [&str; 3] = ["#4e79a7", "#f28e2b", "#59a14f"];

/// Each user's running items at one instant.
struct Sample {
    at: Duration,
    running: BTreeMap<String, i64>,
}

/// How long the demo waits for a broker that is still starting.
const BROKER_START: Duration = Duration::from_secs(30);

pub async fn run(args: DemoArgs) -> Result<(), CliError> {
    let client = client(&args.broker)?;
    let deadline = Instant::now() + BROKER_START;
    while let Err(error) = client.ready().await {
        if Instant::now() > deadline {
            return Err(error.into());
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    let mut pods = start_pods(&args)?;
    let outcome = sample_while_users_arrive(&client, &args).await;
    stop_pods(&mut pods).await;
    let (samples, jobs) = outcome?;
    for job in jobs {
        // Whatever is left of the backlog would otherwise wait for the next worker.
        if let Err(error) = client.steer(job, JobAction::Cancel).await {
            eprintln!("canceling the demo's job {}: {error}", job.0);
        }
    }
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|error| CliError::Input(format!("creating {}: {error}", dir.display())))?;
    }
    std::fs::write(&args.out, chart(&samples, args.duration))
        .map_err(|error| CliError::Input(format!("writing {}: {error}", args.out.display())))?;
    print_summary(&samples, args.duration);
    println!("chart written to {}", args.out.display());
    Ok(())
}

fn start_pods(args: &DemoArgs) -> Result<Vec<Child>, CliError> {
    let program = std::env::current_exe()
        .map_err(|error| CliError::Input(format!("finding this program: {error}")))?;
    let sleep = format!("sleep {}; echo '[]'", args.item_time.as_secs_f64());
    (0..args.pods)
        .map(|pod| {
            Command::new(&program)
                .args(["worker", "--url", &args.broker.url, "--service", SERVICE])
                .args(["--querier", &format!("demo-pod-{pod}"), "--wait", "1s"])
                .args(["--concurrency", &args.concurrency.to_string(), "--", "sh", "-c", &sleep])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .map_err(|error| CliError::Input(format!("starting a worker pod: {error}")))
        })
        .collect()
}

/// SIGTERM: each pod finishes the item it holds, reports it and exits.
async fn stop_pods(pods: &mut [Child]) {
    for pod in pods.iter() {
        if let Some(pid) = pod.id().and_then(|pid| i32::try_from(pid).ok()) {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
    }
    for pod in pods.iter_mut() {
        let _ = pod.wait().await;
    }
}

/// Submits each user's backlog at its time and samples the shares until the demo's end.
async fn sample_while_users_arrive(
    client: &Client,
    args: &DemoArgs,
) -> Result<(Vec<Sample>, Vec<fairway_api::model::JobId>), CliError> {
    // Enough for each user to keep every worker busy for the whole demo.
    let workers = f64::from(args.pods * args.concurrency);
    let items = (workers * args.duration.as_secs_f64() / args.item_time.as_secs_f64()).ceil();
    let items: Vec<_> = (0..items as usize).map(|n| json!({ "payload": { "n": n } })).collect();
    let started = Instant::now();
    let mut jobs = Vec::new();
    let mut samples = Vec::new();
    let mut ticker = tokio::time::interval(SAMPLE_EVERY);
    while started.elapsed() < args.duration {
        ticker.tick().await;
        let due = USERS
            .len()
            .min(1 + (3 * started.elapsed().as_millis() / args.duration.as_millis()) as usize);
        while jobs.len() < due {
            let user = USERS[jobs.len()];
            let job = json!({ "user": user, "steps": [{ "service": SERVICE }], "items": items });
            jobs.push(client.submit(&job).await?.job_id);
        }
        let running = client
            .shares(SERVICE, USERS.len() as u32)
            .await?
            .into_iter()
            .map(|share| (share.user, share.running))
            .collect();
        samples.push(Sample { at: started.elapsed(), running });
    }
    Ok((samples, jobs))
}

/// Each user's share of the running items at each point, averaged over `SMOOTHING` samples.
fn shares(samples: &[Sample]) -> Vec<(Duration, BTreeMap<&str, f64>)> {
    samples
        .windows(SMOOTHING)
        .map(|window| {
            let mut shares = BTreeMap::new();
            for sample in window {
                let total: i64 = sample.running.values().sum();
                for user in USERS {
                    let running = sample.running.get(user).copied().unwrap_or(0);
                    let share = if total > 0 { running as f64 / total as f64 } else { 0.0 };
                    *shares.entry(user).or_insert(0.0) += share / SMOOTHING as f64;
                }
            }
            (window[SMOOTHING - 1].at, shares)
        })
        .collect()
}

fn chart(samples: &[Sample], duration: Duration) -> String {
    let (width, height, left, top, plot_width, plot_height) =
        (720.0, 320.0, 50.0, 30.0, 640.0, 240.0);
    let x = |at: Duration| left + plot_width * at.as_secs_f64() / duration.as_secs_f64();
    let y = |share: f64| top + plot_height * (1.0 - share);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="18">Each user's share of the workers: alice alone, then bob, then carol arrive</text>"#
    );
    for (share, label) in [(0.0, "0"), (1.0 / 3.0, "1/3"), (0.5, "1/2"), (1.0, "all")] {
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="8" y="{:.1}" fill="#666">{label}</text>"##,
            left + plot_width,
            y(share) + 4.0,
            y = y(share),
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{left}" y="{:.1}" fill="#666">0 s</text><text x="{:.1}" y="{:.1}" fill="#666" text-anchor="end">{} s</text>"##,
        top + plot_height + 18.0,
        left + plot_width,
        top + plot_height + 18.0,
        duration.as_secs()
    );
    let points = shares(samples);
    for (index, user) in USERS.iter().enumerate() {
        let line: Vec<String> = points
            .iter()
            .map(|(at, shares)| format!("{:.1},{:.1}", x(*at), y(shares[user])))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline data-user="{user}" fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            COLOURS[index],
            line.join(" ")
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" fill="{}">{user}</text>"#,
            left + plot_width - 120.0 + 45.0 * index as f64,
            top + plot_height + 36.0,
            COLOURS[index]
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Prints each user's mean share in each third of the demo.
fn print_summary(samples: &[Sample], duration: Duration) {
    let points = shares(samples);
    for third in 0..3u32 {
        let (from, to) = (duration * third / 3, duration * (third + 1) / 3);
        let inside: Vec<_> = points.iter().filter(|(at, _)| *at >= from && *at < to).collect();
        if inside.is_empty() {
            continue;
        }
        let means: Vec<String> = USERS
            .iter()
            .map(|user| {
                let mean = inside.iter().map(|(_, shares)| shares[user]).sum::<f64>()
                    / inside.len() as f64;
                format!("{user} {mean:.2}")
            })
            .collect();
        println!("{:>3}–{:>3} s: {}", from.as_secs(), to.as_secs(), means.join(", "));
    }
}
