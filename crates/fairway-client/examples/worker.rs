//! A worker for one service, embedded in a Rust program: it long-polls for items, does the
//! work, and reports each item's results. Run it beside `make run` and a submitted job:
//!
//! ```sh
//! cargo run -p fairway-client --example worker -- http://127.0.0.1:8080 subsetter
//! ```

use std::time::Duration;

use fairway_client::{ClaimParams, Client, ClientError, Report};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    let service = args.next().unwrap_or_else(|| "subsetter".to_owned());
    let client = Client::new(&url, std::env::var("FAIRWAY_TOKEN").ok())?;
    let querier = format!("example-{}", std::process::id());
    let claim = ClaimParams {
        service: &service,
        querier: &querier,
        worker: 0,
        max: 1,
        wait: Duration::from_secs(20),
    };
    loop {
        let items = client.claim(&claim).await?;
        if items.is_empty() {
            println!("no work for {service} in 20 s; stopping");
            return Ok(());
        }
        for item in items {
            // The work itself: here, one result naming the item's payload.
            let results = vec![json!({ "done": item.payload.get() })];
            let report = Report::Successful { attempt: item.attempt, results, component: None };
            let answer = client.report(item.id.0, &report).await?;
            println!("item {} of job {}: {:?}", item.id, item.job_id, answer.status);
        }
    }
}
