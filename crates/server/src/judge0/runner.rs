//! One submission, run as Judge0's worker runs it, each run in a fresh sandbox of its own on
//! the process tier:
//!
//! 1. a sandbox is created through the lifecycle (so it counts against `--max-sandboxes`,
//!    has a deadline, and a restarted daemon finds it), with no network unless the
//!    submission asks and the operator gave `--judge0-network-policy`;
//! 2. the source, stdin and any `additional_files` are written through its agent, before any
//!    submitted code runs; nothing is written into the sandbox after that;
//! 3. the compile command runs (when the language has one) with Judge0's maximum limits,
//!    stdin from `/dev/null`, its output in `compile_output`;
//! 4. the run command runs with the submission's limits: the memory limit is the workload's
//!    memory cgroup, the process limit its pids cgroup, CPU time is the sum over every
//!    process of the workload (Judge0's default, isolate's `--cg-timing`) read from the
//!    host and enforced by polling, with `RLIMIT_CPU` as a per-process backstop, the wall
//!    clock bounds it, and `ulimit -f`/`-s` set the file-size and stack limits inside;
//! 5. the sandbox is deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_api::v1::{CreateSandboxRequest, ErrorCode, Resources};
use airlock_runtime::Workload;

use super::agent_io::{self, Started};
use super::config::{Judge0Config, Limits};
use super::languages::Language;
use super::status::{self, Ending, Status, TimeLimits, Verdict};
use super::submission::{Outcome, Submission};
use crate::agent::Agent;
use crate::error::ApiError;
use crate::lifecycle::Daemon;
use crate::store::now_ms;

/// Where the judge's own files live inside the sandbox (the program's working directory is
/// `/workspace`, Judge0's box).
const STDIN: &str = "/tmp/judge0/stdin";
const STDOUT: &str = "/tmp/judge0/stdout";
const STDERR: &str = "/tmp/judge0/stderr";
const COMPILE_OUTPUT: &str = "/tmp/judge0/compile_output";
const ARCHIVE: &str = "/workspace/additional_files.zip";

/// The metadata key naming the submission a sandbox runs (a restarted daemon finds its
/// orphans by it).
pub const TOKEN_METADATA: &str = "judge0_token";
/// The scratch space of a submission's sandbox: source, binaries and outputs.
const DISK_BYTES: u64 = 256 << 20;
/// How often CPU and wall time are checked while a program runs (isolate polls too).
const POLL: Duration = Duration::from_millis(20);
/// How long after a kill the agent has to report the end before the run counts as broken.
const END_GRACE: Duration = Duration::from_secs(10);
/// How long a create waits for a free sandbox slot at `--max-sandboxes`, between tries.
const CAPACITY_RETRY: Duration = Duration::from_millis(250);

/// Judge0 removes these from compiler options and command-line arguments.
fn strip_shell_characters(text: &str) -> String {
    text.trim()
        .chars()
        .filter(|c| !matches!(c, '$' | '&' | ';' | '<' | '>' | '|' | '`'))
        .collect()
}

/// Runs a submission's runs, reporting each sandbox it creates to `sandbox_created`.
#[derive(Debug, Clone)]
pub struct Runner {
    pub daemon: Arc<Daemon>,
    pub config: Arc<Judge0Config>,
}

/// Why a run could not be judged: the submission becomes an Internal Error with this text.
#[derive(Debug)]
struct InternalError(String);

impl From<ApiError> for InternalError {
    fn from(err: ApiError) -> InternalError {
        InternalError(err.message)
    }
}

/// One sandbox of one run.
struct RunBox {
    id: String,
    agent: Agent,
    workload: Arc<Workload>,
}

impl Runner {
    /// Runs `submission` (which is `Processing`) to its final status.
    pub async fn run(
        &self,
        mut submission: Submission,
        sandbox_created: impl Fn(Option<&str>),
    ) -> Submission {
        let mut times = Vec::new();
        let mut memories = Vec::new();
        let runs = submission.params.number_of_runs.max(1);
        for _ in 0..runs {
            let result = self.one_run(&mut submission, &sandbox_created).await;
            sandbox_created(None);
            match result {
                Ok(()) => {}
                Err(InternalError(message)) => {
                    submission.status = Status::InternalError;
                    submission.outcome.message = Some(message);
                    break;
                }
            }
            if let Some(time) = submission.outcome.time {
                times.push(time);
            }
            if let Some(memory) = submission.outcome.memory {
                memories.push(memory);
            }
            if submission.status != Status::Accepted {
                break;
            }
        }
        // Judge0 averages time and memory over the runs it made.
        if !times.is_empty() {
            submission.outcome.time = Some(times.iter().sum::<f64>() / times.len() as f64);
        }
        if !memories.is_empty() {
            submission.outcome.memory = Some(memories.iter().sum::<u64>() / memories.len() as u64);
        }
        submission.finished_ms = Some(now_ms());
        submission
    }

    async fn one_run(
        &self,
        submission: &mut Submission,
        sandbox_created: &impl Fn(Option<&str>),
    ) -> Result<(), InternalError> {
        let language = self
            .config
            .languages
            .get(submission.params.language_id)
            .cloned()
            .ok_or_else(|| {
                InternalError(format!(
                    "language {} is no longer offered by this server",
                    submission.params.language_id
                ))
            })?;
        let sandbox = self.create_box(submission).await?;
        sandbox_created(Some(&sandbox.id));
        let result = self.judge(submission, &language, &sandbox).await;
        let _ = self.daemon.delete(&sandbox.id).await;
        result
    }

    async fn create_box(&self, submission: &Submission) -> Result<RunBox, InternalError> {
        let l = &self.config.limits;
        let p = &submission.params;
        let memory_kb = p.memory_limit.max(l.max_memory_limit);
        let lifetime = Duration::from_secs_f64(
            l.max_wall_time_limit + p.wall_time_limit + p.cpu_extra_time + 60.0,
        );
        let request = CreateSandboxRequest {
            resources: Resources {
                memory_bytes: Some(
                    memory_kb
                        .saturating_mul(1024)
                        .max(airlock_api::v1::MIN_MEMORY_BYTES),
                ),
                pids_max: Some(
                    l.max_max_processes_and_or_threads
                        .max(p.max_processes_and_or_threads)
                        + 1,
                ),
                cpu_millis: None,
                disk_bytes: Some(DISK_BYTES),
            },
            timeout_ms: Some(u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX)),
            metadata: BTreeMap::from([(TOKEN_METADATA.to_owned(), submission.token.clone())]),
            policy: if p.enable_network {
                self.config.network_policy.clone()
            } else {
                None
            },
            ..CreateSandboxRequest::default()
        };
        let created = loop {
            match self.daemon.create(request.clone()).await {
                Ok(created) => break created,
                // Every sandbox slot is taken: wait for one, as a queued job would.
                Err(err) if err.code == ErrorCode::Capacity => {
                    tokio::time::sleep(CAPACITY_RETRY).await;
                }
                Err(err) => {
                    return Err(InternalError(format!(
                        "cannot create the sandbox: {}",
                        err.message
                    )));
                }
            }
        };
        let id = created.sandbox.id;
        let setup = async {
            let agent = self.daemon.agent(&id).await?;
            let record = self.daemon.live_record(&id)?;
            let workload = record
                .workload()
                .map_err(|e| ApiError::internal(format!("the sandbox's workload: {e}")))?;
            Ok::<_, ApiError>((agent, workload))
        };
        match setup.await {
            Ok((agent, workload)) => Ok(RunBox {
                id,
                agent,
                workload: Arc::new(workload),
            }),
            Err(err) => {
                let _ = self.daemon.delete(&id).await;
                Err(err.into())
            }
        }
    }

    /// Writes the files, compiles, runs and judges, in one sandbox.
    async fn judge(
        &self,
        submission: &mut Submission,
        language: &Language,
        sandbox: &RunBox,
    ) -> Result<(), InternalError> {
        let l = self.config.limits;
        let agent = &sandbox.agent;
        let texts = &submission.texts;
        if let (Some(file), Some(source)) = (&language.source_file, &texts.source_code) {
            agent_io::write_file(agent, &format!("/workspace/{file}"), source.clone()).await?;
        }
        agent_io::write_file(agent, STDIN, texts.stdin.clone().unwrap_or_default()).await?;
        if let Some(archive) = &texts.additional_files {
            agent_io::write_file(agent, ARCHIVE, archive.clone()).await?;
            self.unpack(sandbox).await?;
        }
        if let Some(compile) = compile_script(language, submission, &l) {
            set_limits(
                sandbox,
                l.max_memory_limit,
                l.max_max_processes_and_or_threads,
            )?;
            let limits = StepLimits {
                cpu_seconds: l.max_cpu_time_limit,
                extra_seconds: 0.0,
                wall_seconds: l.max_wall_time_limit,
            };
            let ending = self.step(sandbox, &compile, limits).await?;
            let verdict = status::verdict(&ending, &limits.judged());
            let cap = kb_cap(l.max_max_file_size);
            let output = agent_io::read_file(agent, COMPILE_OUTPUT, cap).await?;
            let mut output = output.map(|(bytes, _)| bytes).filter(|b| !b.is_empty());
            if verdict != Verdict::Ok {
                if matches!(verdict, Verdict::TimedOut { .. }) {
                    output = Some(b"Compilation time limit exceeded.".to_vec());
                }
                submission.texts.compile_output = output;
                submission.status = Status::CompilationError;
                submission.outcome = Outcome::default();
                submission.texts.stdout = None;
                submission.texts.stderr = None;
                return Ok(());
            }
            submission.texts.compile_output = output;
        }
        let p = &submission.params;
        // What compiling left in the page cache is not the program's (isolate gives the run
        // a cgroup of its own).
        sandbox.workload.reset_memory_peak();
        set_limits(sandbox, p.memory_limit, p.max_processes_and_or_threads)?;
        let limits = StepLimits {
            cpu_seconds: p.cpu_time_limit,
            extra_seconds: p.cpu_extra_time,
            wall_seconds: p.wall_time_limit,
        };
        let script = run_script(language, submission);
        let ending = self.step(sandbox, &script, limits).await?;
        let memory_kb = sandbox.workload.memory_peak().map(|bytes| bytes / 1024);
        let cap = kb_cap(p.max_file_size);
        let read = |path| agent_io::read_file(agent, path, cap);
        let stdout = read(STDOUT)
            .await?
            .map(|(b, _)| b)
            .filter(|b| !b.is_empty());
        let stderr = if p.redirect_stderr_to_stdout {
            None
        } else {
            read(STDERR)
                .await?
                .map(|(b, _)| b)
                .filter(|b| !b.is_empty())
        };
        let verdict = status::verdict(&ending, &limits.judged());
        submission.status = status::run_status(
            &verdict,
            submission.texts.expected_output.as_deref(),
            stdout.as_deref(),
        );
        let (exit_code, exit_signal) = match ending.exit {
            status::Exit::Code(code) => (code, None),
            status::Exit::Signal(signal) => (0, Some(signal)),
        };
        submission.outcome = Outcome {
            time: Some(ending.cpu_seconds),
            wall_time: Some(ending.wall_seconds),
            memory: memory_kb,
            exit_code: Some(exit_code),
            exit_signal,
            message: verdict.message().map(str::to_owned),
        };
        submission.texts.stdout = stdout;
        submission.texts.stderr = stderr;
        Ok(())
    }

    /// Unpacks `additional_files` into the working directory, as Judge0 does (`unzip -n`,
    /// within `max_extract_size`), inside the sandbox.
    async fn unpack(&self, sandbox: &RunBox) -> Result<(), InternalError> {
        let l = &self.config.limits;
        set_limits(
            sandbox,
            l.max_memory_limit,
            l.max_max_processes_and_or_threads,
        )?;
        let script = format!(
            "ulimit -f {}; exec </dev/null >/dev/null 2>&1; /usr/bin/unzip -n -qq {ARCHIVE}; rm -f {ARCHIVE}",
            l.max_extract_size
        );
        let limits = StepLimits {
            cpu_seconds: 2.0,
            extra_seconds: 1.0,
            wall_seconds: 4.0,
        };
        self.step(sandbox, &script, limits).await?;
        Ok(())
    }

    /// Runs one script to its end under `limits`, measuring its CPU and wall time; what it
    /// leaves running is killed when its main process ends (isolate ends the box then too).
    async fn step(
        &self,
        sandbox: &RunBox,
        script: &str,
        limits: StepLimits,
    ) -> Result<Ending, InternalError> {
        let workload = sandbox.workload.clone();
        let clock = workload
            .clock()
            .map_err(|e| InternalError(format!("cannot read the workload's CPU time: {e}")))?;
        let started_at = Instant::now();
        let mut process: Started = agent_io::start(&sandbox.agent, script, &environment()).await?;
        let mut ticks = tokio::time::interval(POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut killed_at: Option<Instant> = None;
        let exit = loop {
            tokio::select! {
                exit = process.end() => break exit?,
                _ = ticks.tick() => {
                    if let Some(at) = killed_at {
                        if at.elapsed() > END_GRACE {
                            return Err(InternalError(
                                "the sandbox did not report the end of a killed program".into(),
                            ));
                        }
                        continue;
                    }
                    let cpu = workload.cpu_time(&clock).as_secs_f64();
                    if limits.exceeded(cpu, started_at.elapsed().as_secs_f64()) {
                        kill(&workload).await;
                        killed_at = Some(Instant::now());
                    }
                }
            }
        };
        let wall_seconds = started_at.elapsed().as_secs_f64();
        let cpu_seconds = workload.cpu_time(&clock).as_secs_f64();
        kill(&workload).await;
        if !process.early_output.is_empty() {
            let early = String::from_utf8_lossy(&process.early_output);
            self.daemon.audit.lifecycle(
                Some(&sandbox.id),
                "judge0_note",
                &format!(
                    "before redirecting its output, the script said: {}",
                    early.trim()
                ),
            );
        }
        Ok(Ending {
            exit,
            killed_for_time: killed_at.is_some(),
            cpu_seconds,
            wall_seconds,
        })
    }
}

/// Kills every process of the workload (a fork bomb takes rounds: off the async threads).
async fn kill(workload: &Arc<Workload>) {
    let workload = workload.clone();
    let _ = tokio::task::spawn_blocking(move || workload.kill()).await;
}

fn set_limits(sandbox: &RunBox, memory_kb: u64, tasks: u64) -> Result<(), InternalError> {
    sandbox
        .workload
        .set_limits(memory_kb.saturating_mul(1024), tasks)
        .map_err(|e| InternalError(ApiError::from_chain(ErrorCode::Internal, &e).message))
}

/// At most this many bytes of an output file are read back: its size limit (or 16 MiB
/// when the submission lifted it).
fn kb_cap(kb: u64) -> usize {
    let kb = if kb == 0 { 16 << 10 } else { kb };
    usize::try_from(kb.saturating_mul(1024)).unwrap_or(usize::MAX)
}

/// The environment of every program (Judge0's: `HOME=/tmp` and a fixed `PATH`).
fn environment() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("HOME".to_owned(), "/tmp".to_owned()),
        (
            "PATH".to_owned(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        ),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
    ])
}

/// Time limits of one step; 0 CPU seconds is no CPU limit (isolate's `-t 0`).
#[derive(Debug, Clone, Copy)]
struct StepLimits {
    cpu_seconds: f64,
    extra_seconds: f64,
    wall_seconds: f64,
}

impl StepLimits {
    /// Past the limit plus the extra time, the program is killed.
    fn exceeded(&self, cpu: f64, wall: f64) -> bool {
        (self.cpu_seconds > 0.0 && cpu > self.cpu_seconds + self.extra_seconds)
            || wall > self.wall_seconds + self.extra_seconds
    }

    /// What the status is judged against.
    fn judged(&self) -> TimeLimits {
        TimeLimits {
            cpu_seconds: if self.cpu_seconds > 0.0 {
                self.cpu_seconds
            } else {
                f64::INFINITY
            },
            wall_seconds: self.wall_seconds,
        }
    }
}

/// `ulimit` lines: sizes in KB (0 is unlimited), and a per-process CPU backstop a second
/// past the polled limit.
fn ulimits(file_kb: u64, stack_kb: u64, cpu_seconds: Option<f64>) -> String {
    let size = |kb: u64| {
        if kb == 0 {
            "unlimited".to_owned()
        } else {
            kb.to_string()
        }
    };
    let mut lines = format!(
        "ulimit -f {}; ulimit -s {}; ",
        size(file_kb),
        size(stack_kb)
    );
    if let Some(seconds) = cpu_seconds.filter(|s| *s > 0.0) {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a positive number of seconds below 60"
        )]
        let backstop = seconds.ceil() as u64 + 1;
        lines.push_str(&format!("ulimit -t {backstop}; "));
    }
    lines
}

/// The compile step's script, when the language (or a multi-file program's `compile`
/// script) has one.
fn compile_script(language: &Language, submission: &Submission, l: &Limits) -> Option<String> {
    let command = if language.is_project() {
        // A project compiles only when its archive brought a `compile` script.
        "if [ -f compile ]; then /bin/bash compile; fi".to_owned()
    } else {
        let options =
            strip_shell_characters(submission.params.compiler_options.as_deref().unwrap_or(""));
        language.compile_command(&options)?
    };
    Some(format!(
        "{}exec </dev/null >{COMPILE_OUTPUT} 2>&1; {command}",
        ulimits(
            l.max_max_file_size,
            l.max_stack_limit,
            Some(l.max_cpu_time_limit)
        )
    ))
}

/// The run step's script: the run command with the arguments appended, stdin, stdout and
/// stderr redirected by bash itself, which then becomes the program (bash runs the last
/// simple command of `-c` in place), so that its signals are the program's.
fn run_script(language: &Language, submission: &Submission) -> String {
    let p = &submission.params;
    let command = if language.is_project() {
        "/bin/bash run".to_owned()
    } else {
        language.run_cmd.clone().unwrap_or_default()
    };
    let arguments = strip_shell_characters(p.command_line_arguments.as_deref().unwrap_or(""));
    let stderr = if p.redirect_stderr_to_stdout {
        "&1".to_owned()
    } else {
        STDERR.to_owned()
    };
    format!(
        "{}exec <{STDIN} >{STDOUT} 2>{stderr}; {command} {arguments}",
        ulimits(
            p.max_file_size,
            p.stack_limit,
            Some(p.cpu_time_limit + p.cpu_extra_time)
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_shell_characters_are_stripped_as_judge0_does() {
        // Ruby trims first, then removes: the space before a final `&` stays.
        assert_eq!(
            strip_shell_characters("  -O2 $(id); `x` | y > z & "),
            "-O2 (id) x  y  z "
        );
    }

    #[test]
    fn test_step_limits_kill_past_limit_plus_extra() {
        let limits = StepLimits {
            cpu_seconds: 1.0,
            extra_seconds: 0.5,
            wall_seconds: 3.0,
        };
        assert!(!limits.exceeded(1.4, 1.0));
        assert!(limits.exceeded(1.6, 1.0));
        assert!(limits.exceeded(0.0, 3.6));
        let unlimited = StepLimits {
            cpu_seconds: 0.0,
            ..limits
        };
        assert!(!unlimited.exceeded(100.0, 1.0));
        assert_eq!(unlimited.judged().cpu_seconds, f64::INFINITY);
    }

    #[test]
    fn test_ulimits_use_kb_and_a_backstop() {
        assert_eq!(
            ulimits(1024, 0, Some(5.5)),
            "ulimit -f 1024; ulimit -s unlimited; ulimit -t 7; "
        );
        assert_eq!(ulimits(0, 64, None), "ulimit -f unlimited; ulimit -s 64; ");
    }
}
