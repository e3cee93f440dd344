//! `fairway submit`: a job from flags, or the JSON body of `POST /jobs` from a file.

use std::io::Read;

use serde_json::{json, Value};

use super::{client, CliError};
use crate::args::SubmitArgs;

pub async fn run(args: SubmitArgs) -> Result<(), CliError> {
    let job = match &args.file {
        Some(path) => {
            let text = if path.as_os_str() == "-" {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .map_err(|error| CliError::Input(format!("reading standard input: {error}")))?;
                text
            } else {
                std::fs::read_to_string(path).map_err(|error| {
                    CliError::Input(format!("reading {}: {error}", path.display()))
                })?
            };
            serde_json::from_str(&text)
                .map_err(|error| CliError::Input(format!("the job is not JSON: {error}")))?
        }
        None => job_from_flags(&args)?,
    };
    let client = client(&args.broker)?;
    let submitted = match &args.idempotency_key {
        Some(key) => client.submit_idempotent(&job, key).await?,
        None => client.submit(&job).await?,
    };
    println!("{}", submitted.job_id.0);
    Ok(())
}

fn job_from_flags(args: &SubmitArgs) -> Result<Value, CliError> {
    let items = args
        .item
        .iter()
        .map(|item| {
            serde_json::from_str::<Value>(item)
                .map(|payload| json!({ "payload": payload }))
                .map_err(|error| CliError::Input(format!("--item {item} is not JSON: {error}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let steps: Vec<Value> =
        args.service.iter().map(|service| json!({ "service": service })).collect();
    Ok(json!({
        "user": args.user,
        "tenant": args.tenant,
        "is_async": !args.sync,
        "steps": steps,
        "items": items,
    }))
}
