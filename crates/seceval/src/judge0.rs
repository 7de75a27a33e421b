//! The Judge0 API's cases (`--judge0-listen` on the suite's daemon): Judge0 CE's 2024
//! escapes replayed against Airlock's Judge0-compatible API. CVE-2024-28185 and -28189: code
//! in the box planted symlinks where the worker later wrote (and chowned) files, on the host.
//! CVE-2024-29021: callbacks and networked code reached the judge's internal services.

use std::os::unix::fs::MetadataExt;

use anyhow::{Context, bail};
use hyper::Method;
use serde_json::{Value, json};

use super::catalog::Outcome;
use super::daemon::Daemon;
use super::runner::Env;

/// The one callback host the suite's daemon allows; it does not resolve.
pub const CALLBACK_HOST: &str = "callbacks.seceval.invalid";
/// Judge0's ids for Bash and Python 3.
const BASH: u32 = 46;
const PYTHON: u32 = 71;

pub fn scenario(daemon: &Daemon, name: &str, env: &Env) -> anyhow::Result<Outcome> {
    match name {
        "judge0-symlink-box" => symlink_box(daemon, env),
        "judge0-callback-ssrf" => callback_ssrf(daemon),
        "judge0-network-ssrf" => network_ssrf(daemon),
        other => bail!("unknown scenario `{other}`"),
    }
}

/// `POST /submissions?wait=true`: the status and the body.
fn submit(daemon: &Daemon, body: &Value) -> anyhow::Result<(u16, Value)> {
    let client = daemon.judge0_client()?;
    let key = daemon.key().to_owned();
    let headers = [
        ("x-auth-token", key.as_str()),
        ("content-type", "application/json"),
    ];
    let (status, _, bytes) = daemon.block_on(client.raw(
        Method::POST,
        "/submissions?wait=true&fields=status,stdout,stderr,message",
        &headers,
        serde_json::to_vec(body)?,
    ))?;
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((status.as_u16(), value))
}

fn status_id(answer: &Value) -> i64 {
    answer["status"]["id"].as_i64().unwrap_or(0)
}

/// The box plants a symlink to a host file at every path the judge writes or reads after the
/// program ran (its outputs, the source and scripts of the next run), over two runs. Judge0's
/// worker then wrote through them as root; here the judge writes nothing after a program
/// starts, and each run has a fresh sandbox. `ok=unchanged` when the host file keeps its
/// content, owner and mode.
fn symlink_box(daemon: &Daemon, env: &Env) -> anyhow::Result<Outcome> {
    let victim = env.fixtures.scratch.join("victim");
    let before = std::fs::metadata(&victim).context("the victim fixture")?;
    let victim_text = victim.display().to_string();
    let plant = format!(
        "for f in /tmp/judge0/stdout /tmp/judge0/stderr /tmp/judge0/stdin /tmp/judge0/compile_output \
         /workspace/script.sh /workspace/run /workspace/compile /workspace/additional_files.zip; do \
         rm -rf \"$f\"; ln -s {victim_text} \"$f\"; done; echo planted"
    );
    let (status, answer) = submit(
        daemon,
        &json!({"source_code": plant, "language_id": BASH, "number_of_runs": 2}),
    )?;
    if status != 201 || status_id(&answer) == 0 {
        bail!("the submission was not judged: {status} {answer}");
    }
    let after = std::fs::metadata(&victim)?;
    let text = std::fs::read_to_string(&victim).unwrap_or_default();
    let same_owner =
        (before.uid(), before.gid(), before.mode()) == (after.uid(), after.gid(), after.mode());
    Ok(Outcome::Ok(if text == "fixture\n" && same_owner {
        "unchanged".to_owned()
    } else {
        "the host file changed".to_owned()
    }))
}

/// Callback URLs naming the daemon's own API, a cloud metadata address, and an allow-listed
/// name smuggled as userinfo before an internal host. Control: the allow-listed host is
/// accepted. Judge0 sent `PUT` to any of them.
fn callback_ssrf(daemon: &Daemon) -> anyhow::Result<Outcome> {
    let with_callback =
        |url: &str| json!({"source_code": "echo hi", "language_id": BASH, "callback_url": url});
    let (control, answer) = submit(
        daemon,
        &with_callback(&format!("http://{CALLBACK_HOST}/done")),
    )?;
    if control != 201 {
        bail!("an allow-listed callback host was refused: {control} {answer}");
    }
    let own_api = format!("http://{}/v1/sandboxes", daemon.address());
    let mut last = Outcome::Hung;
    for url in [
        own_api.as_str(),
        "http://169.254.169.254/latest/meta-data/",
        &format!("http://{CALLBACK_HOST}@127.0.0.1:5432/"),
        "http://[::ffff:127.0.0.1]/",
    ] {
        let (status, _) = submit(daemon, &with_callback(url))?;
        if status == 201 {
            return Ok(Outcome::Ok(format!("accepted {url}")));
        }
        last = Outcome::Http(status);
    }
    Ok(last)
}

/// Submitted code asks for the network and, without it, connects to the daemon's API port.
/// Judge0's default let networked code reach the judge's database and Redis.
fn network_ssrf(daemon: &Daemon) -> anyhow::Result<Outcome> {
    let (status, _) = submit(
        daemon,
        &json!({"source_code": "print(1)", "language_id": PYTHON, "enable_network": true}),
    )?;
    if status == 201 {
        return Ok(Outcome::Ok("enable_network accepted".to_owned()));
    }
    let (host, port) = daemon
        .address()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_owned(), p.to_owned()))
        .context("the daemon's address")?;
    let program = format!(
        "import socket\ntry:\n    socket.create_connection(('{host}', {port}), 5)\n    print('ok connected')\n\
         except OSError as e:\n    print('errno', e.errno)\n"
    );
    let (status, answer) = submit(
        daemon,
        &json!({"source_code": program, "language_id": PYTHON}),
    )?;
    if status != 201 {
        bail!("the submission was not judged: {status} {answer}");
    }
    Ok(Outcome::from_probe(
        answer["stdout"].as_str().unwrap_or(""),
        Some(0),
        None,
    ))
}
