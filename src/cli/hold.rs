//! `gpuq hold` and `gpuq release`: keep pending jobs from starting, and let
//! them go again.

use crate::model::JobRef;
use crate::net::proto::{ApiRequest, ApiResponse};

use super::{call, unexpected, CliError};

/// Parses a job id as users write it: `12` or `12_3`.
pub fn parse_job_ref(s: &str) -> Result<JobRef, String> {
    JobRef::parse(s)
}

/// Holds (`hold`) or releases the named jobs; `12` names every pending task
/// of array 12.
pub async fn run(jobs: Vec<JobRef>, hold: bool) -> Result<(), CliError> {
    match call(ApiRequest::Hold { jobs, hold }).await? {
        ApiResponse::Held { ids, hold } => {
            let verb = if hold { "Held" } else { "Released" };
            for id in ids {
                println!("{verb} job {id}");
            }
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}
