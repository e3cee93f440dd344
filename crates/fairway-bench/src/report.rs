//! Writes what a benchmark measured: JSON, an SVG chart and a markdown table with the targets.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::{
    is_wakeup, BenchError, COMPETING_TENANTS_PATH, EVERY_SERVICE_PATH, JOB_WAKEUP_PATH,
    NO_POLICIES_PATH, ONE_LANE_PATH, POLICIES_PATH, SERVICES_PER_USER_PATH, TWO_LANES_PATH,
    WAKEUP_PATH,
};

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_gib: Option<f64>,
    pub postgres: String,
    pub os: String,
}

/// A run's contention per 1,000 items, as the targets table says it.
fn contention_text(run: &Run) -> String {
    match run.contention {
        Some(Contention { deferrals, row_lock_wait_ms }) => format!(
            "{} deferrals, {row_lock_wait_ms:.1} ms waiting for rows",
            deferrals.map(|count| format!("{count:.1}")).unwrap_or_else(|| "?".to_owned())
        ),
        None => "not measured".to_owned(),
    }
}

/// Reads one measured value of a run, for a chart panel.
type Metric = fn(&Run) -> Option<f64>;

#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub path: String,
    pub users: usize,
    pub jobs: usize,
    pub tenants: usize,
    pub components: usize,
    pub backlog: usize,
    pub workers: usize,
    pub max: usize,
    pub duration_s: f64,
    pub claims_per_s: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub jain: Option<f64>,
    /// The highest Jain index any order reaches with as many items over as many users.
    pub jain_bound: Option<f64>,
    pub errors: u64,
    /// WAL written per claim (with its completion) during the path's first pass.
    pub wal_bytes_per_claim: Option<f64>,
    /// What each claim with its completion wrote, during the path's first pass.
    pub writes: Option<Writes>,
    /// How much claims and endings waited on each other, over the whole run.
    pub contention: Option<Contention>,
}

/// What claims and endings waited on each other, per 1,000 items claimed.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Contention {
    /// Worker reports that found their owner's row held by another transaction
    /// (`fairway_ending_deferrals_total`); None where the broker runs out of reach (http).
    pub deferrals: Option<f64>,
    /// Milliseconds the database's backends spent waiting for a row another transaction held
    /// (or for that transaction to end), from pg_stat_activity sampled every few milliseconds.
    pub row_lock_wait_ms: f64,
}

/// Writes per claim (with its completion), from the WAL.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Writes {
    /// Rows inserted, updated or deleted.
    pub rows: f64,
    /// Updates that were not HOT: each wrote an entry into every index of its table.
    pub cold_updates: f64,
    /// Index entries written.
    pub index_entries: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub command: String,
    pub machine: Machine,
    pub runs: Vec<Run>,
}

impl Report {
    /// The run of `path` at a point with one-at-a-time claims (the smallest --max measured).
    fn find(&self, path: &str, users: usize, backlog: usize) -> Option<&Run> {
        self.find_max(path, users, backlog, self.narrow())
    }

    fn find_max(&self, path: &str, users: usize, backlog: usize, max: usize) -> Option<&Run> {
        self.runs.iter().find(|run| {
            run.path == path && run.users == users && run.backlog == backlog && run.max == max
        })
    }

    /// The --max of the matrix, and of the wide claims if any were measured.
    fn narrow(&self) -> usize {
        self.runs.iter().map(|run| run.max).min().unwrap_or(1)
    }

    fn wide(&self) -> Option<usize> {
        self.runs.iter().map(|run| run.max).max().filter(|&max| max > self.narrow())
    }

    /// The matrix points measured, in order.
    fn points(&self) -> Vec<(usize, usize)> {
        let mut points: Vec<_> = self
            .runs
            .iter()
            .filter(|run| !is_wakeup(&run.path))
            .map(|run| (run.users, run.backlog))
            .collect();
        points.sort_unstable_by_key(|&(users, backlog)| (backlog, users));
        points.dedup();
        points
    }

    fn paths(&self) -> Vec<String> {
        let mut paths: Vec<String> = Vec::new();
        for run in self.runs.iter().filter(|run| !is_wakeup(&run.path)) {
            if !paths.contains(&run.path) {
                paths.push(run.path.clone());
            }
        }
        paths
    }

    /// Each target of the issue with its verdict: Some(true) met, Some(false) missed, None not
    /// measured in this run.
    pub fn targets(&self) -> Vec<(String, Option<bool>, String)> {
        let mut targets = Vec::new();
        let claims =
            |path: &str, u, b, max| self.find_max(path, u, b, max).and_then(|run| run.claims_per_s);
        let points = self.points();
        let (narrow, wide) = (self.narrow(), self.wide());

        let mut ratio_target =
            |name: &str, other: &str, factor: f64, points: &[(usize, usize)], max: usize| {
                let mut met = None;
                let mut detail = Vec::new();
                for &(users, backlog) in points {
                    if let (Some(fair), Some(base)) =
                        (claims("fair", users, backlog, max), claims(other, users, backlog, max))
                    {
                        let ratio = fair / base;
                        met = Some(met.unwrap_or(true) && ratio >= factor);
                        // Three decimals (here and below): a ratio just under its bound must not
                        // print as meeting it.
                        detail.push(format!("{users}u/{backlog}: {ratio:.3}x"));
                    }
                }
                targets.push((name.to_owned(), met, detail.join(", ")));
            };
        let batched = "fifo_batched";
        ratio_target("fair ≥ 0.6 × fifo_batched at every point", batched, 0.6, &points, narrow);
        let largest = [(10_000, 1_000_000)];
        ratio_target(
            "fair ≥ 10 × harmony_least_running at 10,000 users × 1,000,000",
            "harmony_least_running",
            10.0,
            &largest,
            narrow,
        );
        ratio_target(
            "fair ≥ 5 × harmony_round_robin at 10,000 users × 1,000,000",
            "harmony_round_robin",
            5.0,
            &largest,
            narrow,
        );
        if let Some(wide) = wide {
            let name = format!("fair ≥ 0.6 × fifo_batched with --max {wide}");
            ratio_target(&name, batched, 0.6, &points, wide);
            let p50 = |path, u, b| self.find_max(path, u, b, wide).and_then(|run| run.p50_ms);
            let mut met = None;
            let mut detail = Vec::new();
            for &(users, backlog) in &points {
                if let (Some(fair), Some(base)) =
                    (p50("fair", users, backlog), p50(batched, users, backlog))
                {
                    met = Some(met.unwrap_or(true) && fair <= 3.0 * base);
                    detail.push(format!("{users}u/{backlog}: {fair:.2} vs {base:.2} ms"));
                }
            }
            let name = format!("fair claim p50 with --max {wide} ≤ 3 × fifo_batched's");
            targets.push((name, met, detail.join(", ")));
        }

        // The claim's p99 stays flat from the smallest point to those with many users and a
        // large backlog.
        let p99 = |u, b| self.find("fair", u, b).and_then(|run| run.p99_ms);
        for (users, backlog) in points.iter().filter(|&&(u, b)| u >= 10_000 && b >= 1_000_000) {
            let flat = match (p99(*users, *backlog), p99(10, 10_000)) {
                (Some(large), Some(small)) => (
                    Some(large <= 1.5 * small),
                    format!("{large:.2} ms vs {small:.2} ms: {:.3}x", large / small),
                ),
                _ => (None, "needs both points".to_owned()),
            };
            let name = format!("fair p99 at {users} × {backlog} ≤ 1.5 × at 10 × 10,000");
            targets.push((name, flat.0, flat.1));
        }

        let mut jain_met = None;
        let mut jain_detail = Vec::new();
        for run in self.runs.iter().filter(|run| run.path == "fair") {
            if let Some(jain) = run.jain {
                jain_met = Some(jain_met.unwrap_or(true) && jain >= 0.99);
                let wide =
                    if run.max > narrow { format!(" (--max {})", run.max) } else { "".into() };
                let best =
                    run.jain_bound.map(|best| format!(" (best {best:.4})")).unwrap_or_default();
                jain_detail.push(format!("{}u/{}{wide}: {jain:.4}{best}", run.users, run.backlog));
            }
        }
        targets.push((
            "fair Jain index ≥ 0.99 at every point".to_owned(),
            jain_met,
            jain_detail.join(", "),
        ));
        // Ours, beyond the issue's matrix: the same bar with tenants competing.
        if let Some(run) = self.runs.iter().find(|run| run.path == COMPETING_TENANTS_PATH) {
            targets.push((
                format!("fair Jain index ≥ 0.99 with {} tenants competing", run.tenants),
                run.jain.map(|jain| jain >= 0.99),
                run.jain
                    .map(|jain| format!("{}u/{}: {jain:.4}", run.users, run.backlog))
                    .unwrap_or_default(),
            ));
        }

        // A claim costs the same however many services its user has work in.
        if let Some(run) = self.runs.iter().find(|run| run.path == SERVICES_PER_USER_PATH) {
            let ratio = run.claims_per_s.zip(claims("fair", run.users, run.backlog, run.max));
            // Not part of the bar, beside it: the same users claimed from in every service.
            let every = self
                .runs
                .iter()
                .find(|run| run.path == EVERY_SERVICE_PATH)
                .and_then(|every| every.claims_per_s.zip(ratio.map(|(_, one)| one)))
                .map(|(every, one)| {
                    format!("; claimed from every service: {every:.0}: {:.3}x", every / one)
                })
                .unwrap_or_default();
            targets.push((
                "fair with work in more services ≥ 0.9 × fair with one".to_owned(),
                ratio.map(|(many, one)| many >= 0.9 * one),
                ratio
                    .map(|(many, one)| {
                        format!(
                            "{}u/{}: {many:.0} vs {one:.0}: {:.3}x{every}",
                            run.users,
                            run.backlog,
                            many / one
                        )
                    })
                    .unwrap_or_default(),
            ));
        }

        // Two services' claim lanes side by side claim at least as fast as one service's lane.
        let one_lane = self.runs.iter().find(|run| run.path == ONE_LANE_PATH);
        let two_lanes = self.runs.iter().filter(|run| run.path.starts_with(TWO_LANES_PATH));
        for (one, two) in two_lanes.filter_map(|two| one_lane.map(|one| (one, two))) {
            let shared = two.path.trim_start_matches(TWO_LANES_PATH).trim_start_matches('_');
            let ratio = two.claims_per_s.zip(one.claims_per_s);
            targets.push((
                format!("fair in two services' lanes, {shared} % of users in both, ≥ 1.0 × one"),
                ratio.map(|(two, one)| two >= one),
                ratio
                    .map(|(two_rate, one_rate)| {
                        format!(
                            "{}u/{}: {two_rate:.0} vs {one_rate:.0}: {:.3}x, Jain {}; per 1,000 \
                             items {} (one lane {})",
                            two.users,
                            two.backlog,
                            two_rate / one_rate,
                            two.jain.map(|jain| format!("{jain:.4}")).unwrap_or_default(),
                            contention_text(two),
                            contention_text(one),
                        )
                    })
                    .unwrap_or_default(),
            ));
        }

        // Policies cost a claim little, and weighted shares hold among the users they decide.
        let policed = self.runs.iter().find(|run| run.path == POLICIES_PATH);
        let unpoliced = self.runs.iter().find(|run| run.path == NO_POLICIES_PATH);
        if let (Some(policed), Some(unpoliced)) = (policed, unpoliced) {
            let ratio = policed.claims_per_s.zip(unpoliced.claims_per_s);
            targets.push((
                "fair with weighted, capped and limited users ≥ 0.8 × fair with none".to_owned(),
                ratio.map(|(with, without)| with >= 0.8 * without),
                ratio
                    .map(|(with, without)| {
                        format!(
                            "{}u/{}: {with:.0} vs {without:.0}: {:.3}x",
                            policed.users,
                            policed.backlog,
                            with / without
                        )
                    })
                    .unwrap_or_default(),
            ));
            targets.push((
                "weighted Jain index ≥ 0.99 over the backlogged users weights decide".to_owned(),
                policed.jain.map(|jain| jain >= 0.99),
                policed.jain.map(|jain| format!("{jain:.4}")).unwrap_or_default(),
            ));
        }

        for (path, target) in
            [(WAKEUP_PATH, "wake-up p99 < 50 ms"), (JOB_WAKEUP_PATH, "job wake-up p99 < 50 ms")]
        {
            let p99 = self.runs.iter().find(|run| run.path == path).and_then(|run| run.p99_ms);
            targets.push((
                target.to_owned(),
                p99.map(|p99| p99 < 50.0),
                p99.map(|p99| format!("{p99:.2} ms")).unwrap_or_default(),
            ));
        }

        let mut http_met = None;
        let mut http_detail = Vec::new();
        for &(users, backlog) in &points {
            if let (Some(http), Some(fair)) =
                (claims("http", users, backlog, narrow), claims("fair", users, backlog, narrow))
            {
                http_met = Some(http_met.unwrap_or(true) && http >= 0.5 * fair);
                http_detail.push(format!("{users}u/{backlog}: {:.3}x", http / fair));
            }
        }
        targets.push(("http ≥ 0.5 × fair".to_owned(), http_met, http_detail.join(", ")));
        targets
    }

    /// Writes the JSON to `json`, and chart.svg and results.md beside it.
    pub fn write(&self, json: &Path) -> Result<(), BenchError> {
        let dir = json.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| BenchError::Unexpected(e.to_string()))?;
        std::fs::write(json, text + "\n")?;
        std::fs::write(dir.join("chart.svg"), self.chart())?;
        std::fs::write(dir.join("results.md"), self.markdown())?;
        Ok(())
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let number = |value: Option<f64>, digits: usize| match value {
            Some(value) => format!("{value:.digits$}"),
            None => "–".to_owned(),
        };
        let _ = writeln!(out, "| path | users | tenants | backlog | workers | max | items/s | p50 ms | p90 ms | p99 ms | Jain | rows/claim | not HOT/claim | index entries/claim | errors |");
        let _ = writeln!(
            out,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for run in &self.runs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                run.path,
                run.users,
                run.tenants,
                run.backlog,
                run.workers,
                run.max,
                number(run.claims_per_s, 0),
                number(run.p50_ms, 2),
                number(run.p90_ms, 2),
                number(run.p99_ms, 2),
                number(run.jain, 4),
                number(run.writes.map(|w| w.rows), 1),
                number(run.writes.map(|w| w.cold_updates), 1),
                number(run.writes.map(|w| w.index_entries), 1),
                run.errors
            );
        }
        let _ = writeln!(out, "\n| target | verdict | measured |\n| --- | --- | --- |");
        for (name, met, detail) in self.targets() {
            let verdict = match met {
                Some(true) => "met",
                Some(false) => "**missed**",
                None => "not measured",
            };
            let _ = writeln!(out, "| {name} | {verdict} | {detail} |");
        }
        out
    }

    /// Claims/s and p99 latency per path across the matrix, on log scales.
    pub fn chart(&self) -> String {
        const COLORS: [&str; 8] = [
            "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666",
        ];
        let points = self.points();
        let paths = self.paths();
        let (width, height, margin) = (520.0, 320.0, 60.0);
        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
            2.0 * width,
            height + 70.0
        );
        let panels: [(&str, Metric); 2] = [
            ("claims per second", |run| run.claims_per_s),
            ("p99 claim latency (ms)", |run| run.p99_ms),
        ];
        for (panel, (title, value)) in panels.iter().enumerate() {
            let left = panel as f64 * width;
            let values: Vec<f64> = self
                .runs
                .iter()
                .filter(|r| !is_wakeup(&r.path))
                .filter_map(value)
                .filter(|v| *v > 0.0)
                .collect();
            let (low, high) =
                values.iter().fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
            if values.is_empty() {
                continue;
            }
            let (low, high) =
                (low.log10().floor(), high.log10().ceil().max(low.log10().floor() + 1.0));
            let x = |i: usize| {
                left + margin
                    + (i as f64 + 0.5) * (width - 1.5 * margin) / points.len().max(1) as f64
            };
            let y = |v: f64| {
                height - margin + 20.0 - (v.log10() - low) / (high - low) * (height - 1.5 * margin)
            };
            let _ = write!(
                svg,
                r#"<text x="{}" y="20" font-size="13" font-weight="bold">{title}</text>"#,
                left + margin
            );
            let mut decade = low;
            while decade <= high {
                let level = 10f64.powf(decade);
                let _ = write!(
                    svg,
                    r##"<line x1="{}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{level}</text>"##,
                    left + margin,
                    left + width - margin / 2.0,
                    left + margin - 4.0,
                    y(level) + 4.0,
                    y = y(level)
                );
                decade += 1.0;
            }
            for (i, (users, backlog)) in points.iter().enumerate() {
                let _ = write!(
                    svg,
                    r#"<text x="{:.1}" y="{}" text-anchor="middle">{users}u</text><text x="{:.1}" y="{}" text-anchor="middle">{backlog}</text>"#,
                    x(i),
                    height - margin + 36.0,
                    x(i),
                    height - margin + 50.0
                );
            }
            for (p, path) in paths.iter().enumerate() {
                let color = COLORS[p % COLORS.len()];
                let coordinates: Vec<String> = points
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &(u, b))| {
                        self.find(path, u, b)
                            .and_then(value)
                            .filter(|v| *v > 0.0)
                            .map(|v| format!("{:.1},{:.1}", x(i), y(v)))
                    })
                    .collect();
                let _ = write!(
                    svg,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                    coordinates.join(" ")
                );
                for point in &coordinates {
                    if let Some((cx, cy)) = point.split_once(',') {
                        let _ =
                            write!(svg, r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>"#);
                    }
                }
            }
        }
        for (p, path) in paths.iter().enumerate() {
            let color = COLORS[p % COLORS.len()];
            let lx = margin + p as f64 * 140.0;
            let _ = write!(
                svg,
                r#"<rect x="{lx}" y="{}" width="12" height="12" fill="{color}"/><text x="{}" y="{}">{path}</text>"#,
                height + 40.0,
                lx + 16.0,
                height + 50.0
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--json FILE` gets the issue's fields; the chart and the table land beside it.
    #[test]
    fn the_json_file_has_every_field_and_the_chart_and_table_go_beside_it() {
        let run = Run {
            path: "fair".to_owned(),
            users: 10,
            jobs: 10,
            tenants: 1,
            components: 1,
            backlog: 10_000,
            workers: 32,
            max: 1,
            duration_s: 10.0,
            claims_per_s: Some(3000.0),
            p50_ms: Some(5.0),
            p90_ms: Some(8.0),
            p99_ms: Some(15.0),
            jain: Some(0.999),
            jain_bound: Some(1.0),
            errors: 0,
            wal_bytes_per_claim: Some(1600.0),
            writes: Some(Writes { rows: 6.0, cold_updates: 4.0, index_entries: 12.0 }),
            contention: None,
        };
        let machine = Machine {
            cores: 2,
            memory_gib: Some(24.0),
            postgres: "15".to_owned(),
            os: "linux".to_owned(),
        };
        let report = Report { command: "fairway bench".to_owned(), machine, runs: vec![run] };
        let dir = std::env::temp_dir().join(format!("fairway-report-{}", std::process::id()));
        let json = dir.join("nested").join("out.json");
        report.write(&json).expect("written");

        let text = std::fs::read_to_string(&json).expect("the JSON file");
        let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert!(value["machine"].is_object());
        let fields = [
            "path",
            "users",
            "tenants",
            "components",
            "backlog",
            "workers",
            "max",
            "duration_s",
            "claims_per_s",
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "jain",
            "jain_bound",
        ];
        for field in fields {
            assert!(!value["runs"][0][field].is_null(), "runs[0] lacks {field}: {text}");
        }
        let beside = json.parent().expect("a directory");
        assert!(beside.join("chart.svg").is_file() && beside.join("results.md").is_file());
        let _ = std::fs::remove_dir_all(dir);
    }
}
