//! `gpuq service`: long-running replicated workloads (inference servers,
//! APIs) scheduled beside batch jobs. Each replica runs as a job named
//! `NAME-INDEX`, shown by `gpuq queue` and accounted by `gpuq acct`; one
//! that ends is started again, later and later while it keeps failing.

use clap::{Args, Parser, Subcommand};

use super::table::{fmt_time, Table};
use super::{call, print_json, unexpected, CliError, JsonFlag};
use crate::net::proto::{ApiRequest, ApiResponse, ServiceInfo};
use crate::spec::SubmitArgs;

// `gpuq service ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum ServiceCommand {
    /// Create a service: REPLICAS copies of the command, each a job with
    /// the resources the job flags ask for (as `gpuq submit`'s), started
    /// again whenever one ends. Each replica gets GPUQ_SERVICE,
    /// GPUQ_REPLICA and PORT (a port no other job on its node has), and
    /// PORT_<NAME> for each --port NAME (as unique).
    Create(CreateArgs),
    /// List services with their replicas (running / wanted).
    List {
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Show one service and each replica: its job, state, node, endpoint,
    /// restarts and why it waits or restarted.
    Show {
        name: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Set the number of replicas: new ones are queued, the highest
    /// indexes beyond N are stopped.
    Scale { name: String, replicas: u32 },
    /// Delete a service; its replicas are stopped.
    Delete { name: String },
    /// Roll the service to a new version (the job flags and command, as
    /// create's): one replica at a time, a new one starts beside an old one
    /// and takes its place once running and healthy, so no fewer replicas
    /// serve. A new replica that fails halts the roll (`show` says why).
    Update(UpdateArgs),
    /// Roll back to the version before the last update, the same way.
    Rollback { name: String },
    /// Make a service be as a TOML file says: created if new, else rolled
    /// to a new version, scaled or changed where the file differs, and left
    /// alone where it does not (applying a file twice changes nothing).
    /// Keys: name, replicas, restart_delay ("5s"), job (the flags and
    /// command as after `gpuq submit`, e.g. "--gpus 1 --wrap 'serve
    /// --port $PORT'"; the environment is only what its --export names,
    /// NONE by default, so another shell applies the same job), and a
    /// [health] table (http, interval, grace, failures); ports = ["metrics"]
    /// names ports as --port does.
    Apply { file: std::path::PathBuf },
    /// The running replicas' `host:port`, one a line (then NAME=host:port
    /// for each named port): what a load balancer or a client reads. With
    /// --json, an array of {replica, endpoint, ports}.
    Endpoints {
        name: String,
        /// Keep watching: print the list again (a JSON array a line with
        /// --json) each time it changes, until interrupted or the service
        /// is deleted.
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        json: JsonFlag,
    },
}

// `gpuq service create NAME --replicas N [job flags] -- CMD ...`
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The service's name: lowercase letters, digits and '-'.
    pub name: String,
    /// How many copies run.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Wait before a replica that ended starts again (5s, 1m), doubled for
    /// each failure within a minute of its start, up to 5 minutes.
    #[arg(long, default_value = "5s", value_parser = parse_delay)]
    pub restart_delay: u64,
    /// Check each replica with an HTTP GET of PATH on its PORT (from its
    /// node): a replica is an endpoint once it answers 2xx or 3xx, and is
    /// stopped and replaced after --health-failures failures in a row
    /// past its --health-grace.
    #[arg(long, value_name = "PATH", conflicts_with = "health_cmd")]
    pub health_http: Option<String>,
    /// Check each replica by running CMD (a shell command line) as you, in
    /// its working directory with its environment (PORT included), on its
    /// node: healthy when it exits 0 within the check's 2 seconds.
    #[arg(long, value_name = "CMD")]
    pub health_cmd: Option<String>,
    /// Time between checks.
    #[arg(long, default_value = "5s", value_parser = parse_delay)]
    pub health_interval: u64,
    /// Time after a replica's start during which failed checks do not count.
    #[arg(long, default_value = "30s", value_parser = parse_delay)]
    pub health_grace: u64,
    /// Failed checks in a row that stop a replica.
    #[arg(long, default_value_t = 3)]
    pub health_failures: u32,
    /// A named port (repeatable): each replica gets PORT_<NAME> (upper-
    /// cased) besides PORT, a port no other job on its node has; the
    /// endpoints list it (`--json`).
    #[arg(long = "port", value_name = "NAME")]
    pub ports: Vec<String>,
    #[command(flatten)]
    pub job: Box<SubmitArgs>,
}

// `gpuq service update NAME [job flags] -- CMD ...`
#[derive(Args, Debug)]
pub struct UpdateArgs {
    pub name: String,
    #[command(flatten)]
    pub job: Box<SubmitArgs>,
}

fn parse_delay(s: &str) -> Result<u64, String> {
    s.parse().or_else(|_| super::policy_change::parse_secs(s))
}

/// Runs `gpuq service ...`.
pub async fn run(cmd: ServiceCommand) -> Result<(), CliError> {
    match cmd {
        ServiceCommand::Create(a) => create(a).await,
        ServiceCommand::Scale { name, replicas } => {
            changed(call(ApiRequest::ServiceScale { name, replicas }).await?)
        }
        ServiceCommand::Delete { name } => changed(call(ApiRequest::ServiceDelete { name }).await?),
        ServiceCommand::Update(a) => {
            let spec = Some(Box::new(spec_here(&a.job)?));
            changed(call(ApiRequest::ServiceUpdate { name: a.name, spec }).await?)
        }
        ServiceCommand::Apply { file } => apply(&file).await,
        ServiceCommand::Rollback { name } => {
            changed(call(ApiRequest::ServiceUpdate { name, spec: None }).await?)
        }
        ServiceCommand::List { json } => {
            let services = fetch(None).await?;
            if json.json {
                return print_json(&services);
            }
            let mut t = Table::new(&["NAME", "USER", "READY", "GPUS_EACH", "CREATED", "COMMAND"]);
            for s in &services {
                t.row(vec![
                    s.name.clone(),
                    s.user.clone(),
                    format!("{}/{}", running(s), s.replicas),
                    s.gpus_per_replica.to_string(),
                    fmt_time(s.created),
                    s.command.clone(),
                ]);
            }
            print!("{}", t.render());
            Ok(())
        }
        ServiceCommand::Show { name, json } => {
            let services = fetch(Some(name)).await?;
            if json.json {
                return print_json(&services);
            }
            for s in &services {
                print!("{}", show(s));
            }
            Ok(())
        }
        ServiceCommand::Endpoints { name, watch, json } => {
            let mut last: Option<Vec<Endpoint>> = None;
            loop {
                let now = match fetch(Some(name.clone())).await {
                    Ok(services) => endpoints(&services),
                    // Deleted while watched: the watch is over.
                    Err(e) if watch && last.is_some() && e.code == 1 => return Ok(()),
                    Err(e) => return Err(e),
                };
                if last.as_ref() != Some(&now) {
                    if json.json {
                        println!("{}", serde_json::to_string(&now).unwrap_or_default());
                    } else {
                        for e in &now {
                            println!("{e}");
                        }
                        if watch {
                            println!();
                        }
                    }
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                    last = Some(now);
                }
                if !watch {
                    return Ok(());
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// The job spec the flags give, as `gpuq submit` builds it here.
fn spec_here(args: &SubmitArgs) -> Result<crate::model::JobSpec, CliError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::input(format!("cannot read the current directory: {e}")))?;
    let spec =
        crate::spec::build_spec(args, &env, &cwd).map_err(|e| CliError::input(e.to_string()))?;
    super::submit::check_output_files(&spec).map_err(CliError::input)?;
    Ok(spec)
}

async fn create(a: CreateArgs) -> Result<(), CliError> {
    let spec = spec_here(&a.job)?;
    let health =
        (a.health_http.is_some() || a.health_cmd.is_some()).then(|| crate::model::HealthCheck {
            path: a.health_http.clone().unwrap_or_default(),
            interval_secs: a.health_interval,
            grace_secs: a.health_grace,
            failures: a.health_failures,
            cmd: a.health_cmd.clone(),
        });
    let req = ApiRequest::ServiceCreate {
        name: a.name.clone(),
        spec: Box::new(spec),
        settings: crate::model::ServiceSettings {
            replicas: a.replicas,
            restart_delay_secs: a.restart_delay,
            health,
            ports: a.ports.clone(),
        },
    };
    match call(req).await? {
        ApiResponse::ServiceChanged { queued, .. } => {
            let ids: Vec<String> = queued.iter().map(ToString::to_string).collect();
            println!(
                "service {} created: replica jobs {}",
                a.name,
                if ids.is_empty() {
                    "-".into()
                } else {
                    ids.join(" ")
                }
            );
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

fn changed(resp: ApiResponse) -> Result<(), CliError> {
    match resp {
        ApiResponse::ServiceChanged { queued, cancelled } => {
            let list = |ids: &[crate::model::JobId]| {
                ids.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            if !queued.is_empty() {
                println!("queued {}", list(&queued));
            }
            if !cancelled.is_empty() {
                println!("stopping {}", list(&cancelled));
            }
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

async fn fetch(name: Option<String>) -> Result<Vec<ServiceInfo>, CliError> {
    match call(ApiRequest::Services { name }).await? {
        ApiResponse::Services { services } => Ok(services),
        other => Err(unexpected(other)),
    }
}

/// One serving replica, as `gpuq service endpoints --json` lists it.
#[derive(Debug, PartialEq, serde::Serialize)]
struct Endpoint {
    replica: u32,
    /// `host:PORT`.
    endpoint: String,
    /// Each named port's `host:port`.
    ports: std::collections::BTreeMap<String, String>,
}

impl std::fmt::Display for Endpoint {
    /// `host:port`, then `NAME=host:port` for each named port.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.endpoint)?;
        for (name, at) in &self.ports {
            write!(f, " {name}={at}")?;
        }
        Ok(())
    }
}

/// The running (and healthy, where checked) replicas.
fn endpoints(services: &[ServiceInfo]) -> Vec<Endpoint> {
    services
        .iter()
        .flat_map(|s| &s.slots)
        .filter_map(|r| {
            Some(Endpoint {
                replica: r.index,
                endpoint: r.endpoint.clone()?,
                ports: r.ports.clone(),
            })
        })
        .collect()
}

fn running(s: &ServiceInfo) -> usize {
    s.slots.iter().filter(|r| r.endpoint.is_some()).count()
}

fn show(s: &ServiceInfo) -> String {
    let mut out = format!(
        "Service {} (user {}): {}/{} replicas running, {} GPUs each, restart delay {} s\n\
         Version {}: {}\n",
        s.name,
        s.user,
        running(s),
        s.replicas,
        s.gpus_per_replica,
        s.restart_delay_secs,
        s.version,
        s.command
    );
    if let Some(roll) = &s.roll {
        out.push_str(&format!("Update: {roll}\n"));
    }
    let mut t = Table::new(&[
        "REPLICA", "VERSION", "JOB", "STATE", "NODE", "ENDPOINT", "RESTARTS", "NEXT", "REASON",
    ]);
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for r in &s.slots {
        t.row(vec![
            r.index.to_string(),
            r.version.to_string(),
            dash(r.job.map(|j| j.to_string())),
            dash(r.state.map(|st| st.to_string())),
            dash(r.node.clone()),
            dash(r.endpoint.clone()),
            r.restarts.to_string(),
            dash(r.next.map(|j| j.to_string())),
            dash(r.reason.clone()),
        ]);
    }
    out.push_str(&t.render());
    out
}

/// A `gpuq service apply` file.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceFile {
    name: String,
    #[serde(default = "one")]
    replicas: u32,
    restart_delay: Option<String>,
    job: String,
    health: Option<HealthFile>,
    #[serde(default)]
    ports: Vec<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthFile {
    http: Option<String>,
    cmd: Option<String>,
    interval: Option<String>,
    grace: Option<String>,
    failures: Option<u32>,
}

fn one() -> u32 {
    1
}

async fn apply(file: &std::path::Path) -> Result<(), CliError> {
    let shown = file.display().to_string();
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::input(format!("cannot read {shown}: {e}")))?;
    let f: ServiceFile = toml::from_str(&text)
        .map_err(|e| CliError::input(format!("{shown} is not a service file: {e}")))?;
    let secs = |key: &str, v: &Option<String>, default: u64| -> Result<u64, CliError> {
        v.as_deref().map_or(Ok(default), |v| {
            parse_delay(v).map_err(|e| CliError::input(format!("{shown}: {key} = {v:?}: {e}")))
        })
    };
    let restart_delay_secs = secs("restart_delay", &f.restart_delay, 5)?;
    let health = match &f.health {
        None => None,
        Some(h) => Some(crate::model::HealthCheck {
            path: h.http.clone().unwrap_or_default(),
            cmd: h.cmd.clone(),
            interval_secs: secs("health.interval", &h.interval, 5)?,
            grace_secs: secs("health.grace", &h.grace, 30)?,
            failures: h.failures.unwrap_or(3),
        }),
    };
    // The job line, read as a `--from` line over a default of no exported
    // environment.
    let defaults = super::submit::JobLine::try_parse_from(["--export=NONE", "--", "-"])
        .map_err(|e| CliError::input(e.to_string()))?;
    let mut defaults = defaults.args;
    defaults.script_or_command.clear();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::input(format!("cannot read the current directory: {e}")))?;
    let job_shown = format!("{shown}: job");
    let mut specs = super::submit::parse_lines(&f.job, &job_shown, &defaults, &env, &cwd)?;
    if specs.len() != 1 {
        return Err(CliError::input(format!(
            "{shown}: job is one line of flags and a command, not {}",
            specs.len()
        )));
    }
    let (_, spec) = specs.remove(0);
    let req = ApiRequest::ServiceApply {
        name: f.name.clone(),
        spec: Box::new(spec),
        settings: crate::model::ServiceSettings {
            replicas: f.replicas,
            restart_delay_secs,
            health,
            ports: f.ports.clone(),
        },
    };
    match call(req).await? {
        ApiResponse::ServiceApplied { changes } if changes.is_empty() => {
            println!("service {} unchanged", f.name);
            Ok(())
        }
        ApiResponse::ServiceApplied { changes } => {
            println!("service {}: {}", f.name, changes.join(", "));
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}
