//! `--judge0-*` flags, the limits Judge0 CE 1.13.1 defaults to, and `GET /config_info`.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::callback::CallbackPolicy;
use super::languages::{Languages, LanguagesError};

/// The Judge0-compatible API's flags (part of `airlockd`'s and `airlock serve`'s).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Judge0Args {
    /// Also serve the Judge0 CE 1.13.1-compatible API on this address (Judge0's port is
    /// 2358). Off unless given.
    #[arg(id = "judge0-listen", long = "judge0-listen", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// A JSON file of languages that adds to, or replaces by id, the built-in table
    /// (`{"languages": [{"id", "name", "source_file", "compile_cmd", "run_cmd",
    /// "is_archived", "requires"}], "replace_defaults": false}`).
    #[arg(
        id = "judge0-languages",
        long = "judge0-languages",
        value_name = "FILE"
    )]
    pub languages: Option<PathBuf>,
    /// How many submissions run at once; the rest wait in the queue (in the store).
    #[arg(
        id = "judge0-workers",
        long = "judge0-workers",
        value_name = "N",
        default_value_t = 2
    )]
    pub workers: usize,
    /// The most submissions waiting at once; past it creates get 503 `queue is full`.
    #[arg(
        id = "judge0-max-queue",
        long = "judge0-max-queue",
        value_name = "N",
        default_value_t = 100
    )]
    pub max_queue: u64,
    /// Hosts a submission's `callback_url` may name (`HOST` or `HOST:PORT`, comma-separated).
    /// Without it callbacks are refused.
    #[arg(
        id = "judge0-callback-hosts",
        long = "judge0-callback-hosts",
        value_name = "HOST[:PORT],...",
        value_delimiter = ','
    )]
    pub callback_hosts: Vec<String>,
    /// Let callbacks reach loopback, private and link-local addresses (an allow-listed host
    /// on the operator's own network). Off: such destinations are refused after resolution.
    #[arg(id = "judge0-callback-internal", long = "judge0-callback-internal")]
    pub callback_internal: bool,
    /// A policy file whose `network` section (mode `proxy`) applies to submissions with
    /// `enable_network: true`. Without it `enable_network` is refused.
    #[arg(
        id = "judge0-network-policy",
        long = "judge0-network-policy",
        value_name = "FILE"
    )]
    pub network_policy: Option<PathBuf>,
    /// How long finished submissions are kept before they are deleted (e.g. 30m, 24h).
    #[arg(id = "judge0-retention", long = "judge0-retention", value_name = "DURATION", default_value = "168h",
          value_parser = parse_duration)]
    pub retention_ms: u64,
}

fn parse_duration(value: &str) -> Result<u64, String> {
    airlock_api::parse_duration_ms(value).map_err(|e| e.to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum Judge0ConfigError {
    #[error(transparent)]
    Languages(#[from] LanguagesError),
    #[error("--judge0-workers must be between 1 and 64")]
    Workers,
    #[error("--judge0-max-queue must be at least 1")]
    MaxQueue,
    #[error("--judge0-callback-hosts: {0}")]
    CallbackHost(String),
    #[error("--judge0-network-policy: cannot read {0}")]
    PolicyRead(PathBuf, #[source] std::io::Error),
    #[error("--judge0-network-policy: {0}")]
    Policy(String),
}

/// Judge0's limits: defaults and maxima (its `Config`), in its units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub cpu_time_limit: f64,
    pub max_cpu_time_limit: f64,
    pub cpu_extra_time: f64,
    pub max_cpu_extra_time: f64,
    pub wall_time_limit: f64,
    pub max_wall_time_limit: f64,
    /// KB.
    pub memory_limit: u64,
    pub max_memory_limit: u64,
    /// KB.
    pub stack_limit: u64,
    pub max_stack_limit: u64,
    pub max_processes_and_or_threads: u64,
    pub max_max_processes_and_or_threads: u64,
    /// KB.
    pub max_file_size: u64,
    pub max_max_file_size: u64,
    pub number_of_runs: u64,
    pub max_number_of_runs: u64,
    /// KB: the most an `additional_files` archive may unpack to.
    pub max_extract_size: u64,
    pub max_submission_batch_size: usize,
    /// Characters.
    pub max_option_chars: usize,
}

/// Judge0 CE 1.13.1's defaults.
pub const LIMITS: Limits = Limits {
    cpu_time_limit: 5.0,
    max_cpu_time_limit: 15.0,
    cpu_extra_time: 1.0,
    max_cpu_extra_time: 5.0,
    wall_time_limit: 10.0,
    max_wall_time_limit: 20.0,
    memory_limit: 128_000,
    max_memory_limit: 512_000,
    stack_limit: 64_000,
    max_stack_limit: 128_000,
    max_processes_and_or_threads: 60,
    max_max_processes_and_or_threads: 120,
    max_file_size: 1024,
    max_max_file_size: 4096,
    number_of_runs: 1,
    max_number_of_runs: 20,
    max_extract_size: 10_240,
    max_submission_batch_size: 20,
    max_option_chars: 512,
};

/// The version the Python SDK needs to read from `/about` to resolve its language aliases.
pub const JUDGE0_VERSION: &str = "1.13.1";

/// The checked configuration of the Judge0 API.
#[derive(Debug, Clone)]
pub struct Judge0Config {
    pub listen: SocketAddr,
    pub workers: usize,
    pub max_queue: u64,
    pub limits: Limits,
    pub languages: Languages,
    pub callbacks: CallbackPolicy,
    /// The policy document of submissions with `enable_network: true`.
    pub network_policy: Option<Box<airlock_api::policy::PolicyDocument>>,
    /// Whether `additional_files` can be unpacked (the host has `unzip`).
    pub additional_files: bool,
    pub retention_ms: u64,
}

impl Judge0Config {
    /// `None` when `--judge0-listen` is not given.
    pub fn from_args(args: &Judge0Args) -> Result<Option<Judge0Config>, Judge0ConfigError> {
        let Some(listen) = args.listen else {
            return Ok(None);
        };
        if args.workers == 0 || args.workers > 64 {
            return Err(Judge0ConfigError::Workers);
        }
        if args.max_queue == 0 {
            return Err(Judge0ConfigError::MaxQueue);
        }
        let languages = Languages::load(args.languages.as_deref())?;
        let callbacks = CallbackPolicy::new(&args.callback_hosts, args.callback_internal)
            .map_err(Judge0ConfigError::CallbackHost)?;
        let network_policy = args
            .network_policy
            .as_deref()
            .map(load_network_policy)
            .transpose()?;
        Ok(Some(Judge0Config {
            listen,
            workers: args.workers,
            max_queue: args.max_queue,
            limits: LIMITS,
            additional_files: languages.get(89).is_some()
                || std::path::Path::new("/usr/bin/unzip").is_file(),
            languages,
            callbacks,
            network_policy,
            retention_ms: args.retention_ms.max(1),
        }))
    }

    /// `GET /config_info`: the 39 keys of Judge0 CE 1.13.1, every one of which the Python
    /// SDK requires, with this daemon's values.
    pub fn info(&self) -> Value {
        let l = &self.limits;
        json!({
            "maintenance_mode": false,
            "enable_wait_result": true,
            "enable_compiler_options": true,
            "allowed_languages_for_compile_options": [],
            "enable_command_line_arguments": true,
            "enable_submission_delete": false,
            "enable_callbacks": self.callbacks.enabled(),
            "callbacks_max_tries": super::callback::MAX_TRIES,
            "callbacks_timeout": super::callback::TIMEOUT.as_secs_f64(),
            "enable_additional_files": self.additional_files,
            "max_queue_size": self.max_queue,
            "cpu_time_limit": l.cpu_time_limit,
            "max_cpu_time_limit": l.max_cpu_time_limit,
            "cpu_extra_time": l.cpu_extra_time,
            "max_cpu_extra_time": l.max_cpu_extra_time,
            "wall_time_limit": l.wall_time_limit,
            "max_wall_time_limit": l.max_wall_time_limit,
            "memory_limit": l.memory_limit,
            "max_memory_limit": l.max_memory_limit,
            "stack_limit": l.stack_limit,
            "max_stack_limit": l.max_stack_limit,
            "max_processes_and_or_threads": l.max_processes_and_or_threads,
            "max_max_processes_and_or_threads": l.max_max_processes_and_or_threads,
            "enable_per_process_and_thread_time_limit": false,
            "allow_enable_per_process_and_thread_time_limit": false,
            "enable_per_process_and_thread_memory_limit": false,
            "allow_enable_per_process_and_thread_memory_limit": false,
            "max_file_size": l.max_file_size,
            "max_max_file_size": l.max_max_file_size,
            "number_of_runs": l.number_of_runs,
            "max_number_of_runs": l.max_number_of_runs,
            "redirect_stderr_to_stdout": false,
            "max_extract_size": l.max_extract_size,
            "enable_batched_submissions": true,
            "max_submission_batch_size": l.max_submission_batch_size,
            "submission_cache_duration": 0.0,
            "use_docs_as_homepage": false,
            "allow_enable_network": self.network_policy.is_some(),
            "enable_network": false,
        })
    }
}

/// Reads the policy of networked submissions: valid, and in `proxy` mode (the only mode
/// that reaches anything; `none` would make `enable_network` a lie).
fn load_network_policy(
    path: &std::path::Path,
) -> Result<Box<airlock_api::policy::PolicyDocument>, Judge0ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Judge0ConfigError::PolicyRead(path.to_owned(), e))?;
    let policy = airlock_policy::Policy::from_yaml(&path.display().to_string(), &text)
        .map_err(|e| Judge0ConfigError::Policy(e.to_string()))?;
    if crate::egress::proxy_plan(&policy).is_none() {
        return Err(Judge0ConfigError::Policy(format!(
            "{}: network.mode must be proxy (the egress proxy carries a networked submission's traffic)",
            path.display()
        )));
    }
    Ok(Box::new(policy.document().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_config_info_has_every_key_the_python_sdk_reads() {
        let args = Judge0Args {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            workers: 2,
            max_queue: 100,
            ..Judge0Args::default()
        };
        let config = Judge0Config::from_args(&args).unwrap().unwrap();
        let info = config.info();
        let keys = info.as_object().unwrap();
        // The judge0 0.0.8 SDK's `Config` model, field by field.
        for key in [
            "allow_enable_network",
            "allow_enable_per_process_and_thread_memory_limit",
            "allow_enable_per_process_and_thread_time_limit",
            "allowed_languages_for_compile_options",
            "callbacks_max_tries",
            "callbacks_timeout",
            "cpu_extra_time",
            "cpu_time_limit",
            "enable_additional_files",
            "enable_batched_submissions",
            "enable_callbacks",
            "enable_command_line_arguments",
            "enable_compiler_options",
            "enable_network",
            "enable_per_process_and_thread_memory_limit",
            "enable_per_process_and_thread_time_limit",
            "enable_submission_delete",
            "enable_wait_result",
            "maintenance_mode",
            "max_cpu_extra_time",
            "max_cpu_time_limit",
            "max_extract_size",
            "max_file_size",
            "max_max_file_size",
            "max_max_processes_and_or_threads",
            "max_memory_limit",
            "max_number_of_runs",
            "max_processes_and_or_threads",
            "max_queue_size",
            "max_stack_limit",
            "max_submission_batch_size",
            "max_wall_time_limit",
            "memory_limit",
            "number_of_runs",
            "redirect_stderr_to_stdout",
            "stack_limit",
            "submission_cache_duration",
            "use_docs_as_homepage",
            "wall_time_limit",
        ] {
            assert!(keys.contains_key(key), "{key}");
        }
        assert_eq!(keys.len(), 39);
        assert_eq!(info["cpu_time_limit"], json!(5.0));
        assert_eq!(info["enable_callbacks"], json!(false));
        assert_eq!(info["allow_enable_network"], json!(false));
        assert_eq!(info["max_submission_batch_size"], json!(20));
    }

    #[test]
    fn test_bad_flags_are_refused_by_name() {
        let mut args = Judge0Args {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            workers: 0,
            max_queue: 100,
            ..Judge0Args::default()
        };
        assert!(matches!(
            Judge0Config::from_args(&args),
            Err(Judge0ConfigError::Workers)
        ));
        args.workers = 1;
        args.callback_hosts = vec!["http://x".into()];
        let err = Judge0Config::from_args(&args).unwrap_err();
        assert!(
            err.to_string().starts_with("--judge0-callback-hosts: "),
            "{err}"
        );
        args.callback_hosts.clear();
        args.network_policy = Some("/nonexistent/policy.yaml".into());
        assert!(matches!(
            Judge0Config::from_args(&args),
            Err(Judge0ConfigError::PolicyRead(..))
        ));
        args.listen = None;
        assert!(Judge0Config::from_args(&args).unwrap().is_none());
    }
}
