//! Byte-level tests of `process.Process` and the Connect framing against the real binary.

#[cfg(test)]
mod common;

use std::io::Read;

use common::{Body, TestAgent, b64, bash, collect, envelope, read_until, start_pid};
use serde_json::json;

#[test]
fn start_streams_start_then_output_then_end_and_an_end_frame() {
    let agent = TestAgent::start("framing");
    let mut conn = agent.connect();
    let request = envelope(0, &bash("echo hi; echo oops >&2; exit 3"));
    conn.send(
        "POST",
        "/process.Process/Start",
        &[
            ("Content-Type", "application/connect+json"),
            ("Connect-Timeout-Ms", "60000"),
        ],
        Body::Fixed(&request),
    );
    let head = conn.head();
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-type"),
        Some("application/connect+json")
    );
    let mut raw = Vec::new();
    conn.body(&head).read_to_end(&mut raw).unwrap();

    // Walk the raw envelopes: [flags u8][len u32 BE][json].
    let mut frames = Vec::new();
    let mut at = 0;
    while at < raw.len() {
        let len = u32::from_be_bytes(raw[at + 1..at + 5].try_into().unwrap()) as usize;
        let json: serde_json::Value = serde_json::from_slice(&raw[at + 5..at + 5 + len]).unwrap();
        frames.push((raw[at], json));
        at += 5 + len;
    }
    assert_eq!(at, raw.len(), "trailing bytes after the envelopes");
    assert_eq!(frames.first().unwrap().0, 0);
    assert!(
        frames[0].1["event"]["start"]["pid"].as_u64().unwrap() > 1,
        "{:?}",
        frames[0]
    );
    let (last_flags, last) = frames.last().unwrap();
    assert_eq!((*last_flags, last), (2, &json!({})));
    let end = &frames[frames.len() - 2].1["event"]["end"];
    assert_eq!(end["exitCode"], 3);
    assert_eq!(end["exited"], true);
    assert_eq!(end["status"], "exit status 3");
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    for (flags, json) in &frames[1..frames.len() - 2] {
        assert_eq!(*flags, 0);
        let data = &json["event"]["data"];
        if let Some(d) = data.get("stdout") {
            stdout.extend(common::unb64(d));
        }
        if let Some(d) = data.get("stderr") {
            stderr.extend(common::unb64(d));
        }
    }
    assert_eq!(stdout, b"hi\n");
    assert_eq!(stderr, b"oops\n");

    // The connection is still usable afterwards.
    assert_eq!(
        conn.ok("process.Process/List", &json!({})),
        json!({"processes": []})
    );
}

#[test]
fn unary_errors_carry_connect_json_and_the_mapped_status() {
    let agent = TestAgent::start("unary-errors");
    let mut conn = agent.connect();
    let (status, json) = conn.unary(
        "process.Process/SendSignal",
        &json!({"process": {"pid": 999_999}, "signal": "SIGNAL_SIGKILL"}),
    );
    assert_eq!(status, 404);
    assert_eq!(json["code"], "not_found");
    assert!(
        json["message"].as_str().unwrap().contains("999999"),
        "{json}"
    );

    let (status, json) = conn.unary("process.Process/Nope", &json!({}));
    assert_eq!(
        (status, json["code"].as_str()),
        (501, Some("unimplemented"))
    );

    let (status, json) = conn.unary(
        "process.Process/SendSignal",
        &json!({"process": {"pid": 1}, "signal": "SIGNAL_BOGUS"}),
    );
    assert_eq!(
        (status, json["code"].as_str()),
        (404, Some("not_found")),
        "pid 1 is not ours: {json}"
    );

    conn.send(
        "POST",
        "/process.Process/List",
        &[("Content-Type", "application/json")],
        Body::Fixed(b"{not json"),
    );
    let (head, body) = conn.response();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (head.status, json["code"].as_str()),
        (400, Some("invalid_argument"))
    );

    conn.send(
        "POST",
        "/process.Process/List",
        &[("Content-Type", "application/proto")],
        Body::Fixed(b"\x00"),
    );
    let (head, _) = conn.response();
    assert_eq!(head.status, 415);
}

#[test]
fn stream_errors_arrive_in_the_end_frame_with_status_200() {
    let agent = TestAgent::start("stream-errors");
    let mut conn = agent.connect();
    let request = json!({"process": {"cmd": "/bin/true", "cwd": "/nonexistent/dir"}});
    let mut stream = conn.open_stream("process.Process/Start", &request, &[]);
    let (flags, end) = stream.envelope().unwrap();
    assert_eq!(flags, 2);
    assert_eq!(end["error"]["code"], "invalid_argument");
    assert!(
        end["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/dir"),
        "{end}"
    );
    assert!(stream.envelope().is_none());

    let mut stream = conn.open_stream(
        "process.Process/Connect",
        &json!({"process": {"pid": 424_242}}),
        &[],
    );
    assert_eq!(stream.end_frame()["error"]["code"], "not_found");

    // A compressed request envelope is refused.
    let mut frame = envelope(0, &bash("true"));
    frame[0] = 1;
    conn.send(
        "POST",
        "/process.Process/Start",
        &[("Content-Type", "application/connect+json")],
        Body::Fixed(&frame),
    );
    let head = conn.head();
    assert_eq!(head.status, 200);
    assert_eq!(
        conn.body(&head).end_frame()["error"]["code"],
        "invalid_argument"
    );
}

#[test]
fn chunked_request_bodies_work_for_streams_and_unary_calls() {
    let agent = TestAgent::start("chunked");
    let mut conn = agent.connect();
    let frame = envelope(0, &bash("echo chunked"));
    let pieces: Vec<&[u8]> = frame.chunks(3).collect();
    conn.send(
        "POST",
        "/process.Process/Start",
        &[("Content-Type", "application/connect+json")],
        Body::Chunked(pieces),
    );
    let head = conn.head();
    let mut stream = conn.body(&head);
    start_pid(&mut stream);
    let out = collect(&mut stream);
    assert_eq!(out.stdout, b"chunked\n");
    assert_eq!(out.end["exitCode"], 0);

    let message = json!({"path": "/"}).to_string();
    let pieces: Vec<&[u8]> = message.as_bytes().chunks(2).collect();
    conn.send(
        "POST",
        "/filesystem.Filesystem/Stat",
        &[("Content-Type", "application/json")],
        Body::Chunked(pieces),
    );
    let (head, body) = conn.response();
    assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&body));
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["entry"]["type"], "FILE_TYPE_DIRECTORY");
}

#[test]
fn keep_alive_survives_errors_with_unread_bodies() {
    let agent = TestAgent::start("keepalive");
    let mut conn = agent.connect();
    let big = vec![b'x'; 300_000];
    // Unknown route with a large body, then an RPC error, then a malformed stream: the next
    // request on the same connection must still be parsed correctly.
    conn.send("POST", "/nope", &[], Body::Fixed(&big));
    assert_eq!(conn.response().0.status, 404);
    conn.send(
        "POST",
        "/filesystem.Filesystem/Stat",
        &[("Content-Type", "application/json")],
        Body::Chunked(vec![&big[..1000], &big[1000..]]),
    );
    assert_eq!(conn.response().0.status, 400);
    conn.send(
        "POST",
        "/process.Process/Start",
        &[("Content-Type", "application/connect+json")],
        Body::Fixed(&big),
    );
    let head = conn.head();
    assert_eq!(
        conn.body(&head).end_frame()["error"]["code"],
        "invalid_argument"
    );
    conn.send("GET", "/health", &[], Body::None);
    assert_eq!(conn.response().0.status, 204);
    let (status, json) = conn.unary(
        "filesystem.Filesystem/Stat",
        &json!({"path": "/nonexistent-xyz"}),
    );
    assert_eq!((status, json["code"].as_str()), (404, Some("not_found")));
}

#[test]
fn output_and_end_are_never_lost_for_fast_processes() {
    let agent = TestAgent::start("subscribe-first");
    let mut conn = agent.connect();
    for i in 0..60 {
        let request = if i % 2 == 0 {
            json!({"process": {"cmd": "echo", "args": [format!("fast{i}")]}})
        } else {
            bash(&format!("echo err{i} >&2"))
        };
        let mut stream = conn.open_stream("process.Process/Start", &request, &[]);
        start_pid(&mut stream);
        let out = collect(&mut stream);
        if i % 2 == 0 {
            assert_eq!(out.stdout, format!("fast{i}\n").as_bytes(), "run {i}");
        } else {
            assert_eq!(out.stderr, format!("err{i}\n").as_bytes(), "run {i}");
        }
        assert_eq!(out.end["exitCode"], 0, "run {i}");
        assert_eq!(out.end_frame, json!({}));
    }
}

#[test]
fn a_dropped_stream_leaves_the_process_running_and_connect_reattaches() {
    let agent = TestAgent::start("reattach");
    let go = agent.dir.join("go");
    let script = format!(
        "echo first; while [ ! -e '{go}' ]; do sleep 0.02; done; echo second",
        go = go.display()
    );
    let pid = {
        let mut conn = agent.connect();
        let mut stream = conn.open_stream(
            "process.Process/Start",
            &json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", script]}, "tag": "waiter"}),
            &[],
        );
        let pid = start_pid(&mut stream);
        read_until(&mut stream, "first");
        pid
        // The connection is dropped here, mid-stream.
    };
    let mut conn = agent.connect();
    let list = conn.ok("process.Process/List", &json!({}));
    let procs = list["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{list}");
    assert_eq!(procs[0]["pid"], pid);
    assert_eq!(procs[0]["tag"], "waiter");
    assert_eq!(procs[0]["config"]["cmd"], "/bin/bash");

    let mut stream = conn.open_stream(
        "process.Process/Connect",
        &json!({"process": {"tag": "waiter"}}),
        &[],
    );
    assert_eq!(start_pid(&mut stream), pid);
    std::fs::write(&go, b"").unwrap();
    let out = collect(&mut stream);
    assert_eq!(out.stdout, b"second\n", "only output after attaching");
    assert_eq!(out.end["exitCode"], 0);
}

#[test]
fn fifty_megabytes_of_output_arrive_intact() {
    let agent = TestAgent::start("huge");
    let file = agent.dir.join("big.bin");
    // Deterministic, incompressible-looking content.
    let mut data = Vec::with_capacity(50_000_000);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while data.len() < 50_000_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(50_000_000);
    std::fs::write(&file, &data).unwrap();
    let mut conn = agent.connect();
    let mut stream = conn.open_stream(
        "process.Process/Start",
        &json!({"process": {"cmd": "cat", "args": [file.to_str().unwrap()]}}),
        &[],
    );
    start_pid(&mut stream);
    let out = collect(&mut stream);
    assert_eq!(out.stdout.len(), data.len());
    assert_eq!(fnv1a(&out.stdout), fnv1a(&data));
    assert!(out.stdout == data);
    assert_eq!(out.end["exitCode"], 0);
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn connect_timeout_ms_kills_the_process_group() {
    let agent = TestAgent::start("timeout");
    let mut conn = agent.connect();
    let mut stream = conn.open_stream(
        "process.Process/Start",
        &bash("sleep 1000 & sleep 1000"),
        &[("Connect-Timeout-Ms", "300")],
    );
    start_pid(&mut stream);
    let out = collect(&mut stream);
    assert_eq!(out.end["exitCode"], -1);
    assert_eq!(out.end["exited"], false);
    assert_eq!(out.end["status"], "signal: killed");
    assert_eq!(
        conn.ok("process.Process/List", &json!({})),
        json!({"processes": []})
    );
}

#[test]
fn send_signal_terminates_and_accepts_numbers_and_snake_case() {
    let agent = TestAgent::start("signal");
    let mut conn = agent.connect();
    let mut stream_conn = agent.connect();
    let mut stream = stream_conn.open_stream(
        "process.Process/Start",
        &bash("echo ready; exec sleep 1000"),
        &[],
    );
    let pid = start_pid(&mut stream);
    read_until(&mut stream, "ready");
    // A pid as a string and the enum as a number, as proto3 JSON allows.
    conn.ok(
        "process.Process/SendSignal",
        &json!({"process": {"pid": pid.to_string()}, "signal": 15, "unknown_field": 1}),
    );
    let out = collect(&mut stream);
    assert_eq!(out.end["status"], "signal: terminated");
    assert_eq!(out.end["exitCode"], -1);
}

#[test]
fn send_input_and_close_stdin_drive_cat() {
    let agent = TestAgent::start("stdin");
    let mut conn = agent.connect();
    let mut stream_conn = agent.connect();
    let mut stream = stream_conn.open_stream(
        "process.Process/Start",
        &json!({"process": {"cmd": "cat"}, "stdin": true}),
        &[],
    );
    let pid = start_pid(&mut stream);
    conn.ok(
        "process.Process/SendInput",
        &json!({"process": {"pid": pid}, "input": {"stdin": b64(b"hello\n")}}),
    );
    read_until(&mut stream, "hello\n");
    conn.ok(
        "process.Process/CloseStdin",
        &json!({"process": {"pid": pid}}),
    );
    let out = collect(&mut stream);
    assert_eq!(out.end["exitCode"], 0);
    // Without stdin:true the process reads /dev/null and input is refused.
    let mut stream = stream_conn.open_stream(
        "process.Process/Start",
        &json!({"process": {"cmd": "cat"}}),
        &[],
    );
    start_pid(&mut stream);
    let out = collect(&mut stream);
    assert_eq!(
        (out.stdout.len(), out.end["exitCode"].as_i64()),
        (0, Some(0))
    );
}

#[test]
fn stream_input_feeds_stdin_from_a_client_stream() {
    let agent = TestAgent::start("stream-input");
    let mut conn = agent.connect();
    let mut stream_conn = agent.connect();
    let mut stream = stream_conn.open_stream(
        "process.Process/Start",
        &json!({"process": {"cmd": "cat"}, "stdin": true}),
        &[],
    );
    let pid = start_pid(&mut stream);
    let frames = [
        envelope(0, &json!({"start": {"process": {"pid": pid}}})),
        envelope(0, &json!({"data": {"input": {"stdin": b64(b"streamed ")}}})),
        envelope(0, &json!({"keepalive": {}})),
        envelope(0, &json!({"data": {"input": {"stdin": b64(b"input\n")}}})),
    ];
    let all: Vec<u8> = frames.concat();
    let pieces: Vec<&[u8]> = all.chunks(7).collect();
    conn.send(
        "POST",
        "/process.Process/StreamInput",
        &[("Content-Type", "application/connect+json")],
        Body::Chunked(pieces),
    );
    let head = conn.head();
    assert_eq!(head.status, 200);
    let mut body = conn.body(&head);
    assert_eq!(body.message(), json!({}));
    assert_eq!(body.end_frame(), json!({}));
    read_until(&mut stream, "streamed input\n");
    conn.ok(
        "process.Process/CloseStdin",
        &json!({"process": {"pid": pid}}),
    );
    assert_eq!(collect(&mut stream).end["exitCode"], 0);
}

#[test]
fn a_pty_echoes_input_and_can_be_resized() {
    let agent = TestAgent::start("pty");
    let mut conn = agent.connect();
    let mut stream_conn = agent.connect();
    let request = json!({
        "process": {"cmd": "/bin/sh", "args": ["-c", "read line; echo got:$line; stty size"], "envs": {"TERM": "xterm-256color"}},
        "pty": {"size": {"cols": 80, "rows": 24}},
    });
    let mut stream = stream_conn.open_stream("process.Process/Start", &request, &[]);
    let pid = start_pid(&mut stream);
    conn.ok(
        "process.Process/Update",
        &json!({"process": {"pid": pid}, "pty": {"size": {"cols": 100, "rows": 30}}}),
    );
    conn.ok(
        "process.Process/SendInput",
        &json!({"process": {"pid": pid}, "input": {"pty": b64(b"ping\n")}}),
    );
    let out = collect(&mut stream);
    let text = String::from_utf8_lossy(&out.pty);
    assert!(text.contains("ping\r\n"), "terminal echo missing: {text:?}");
    assert!(text.contains("got:ping\r\n"), "{text:?}");
    assert!(text.contains("30 100"), "resize not seen: {text:?}");
    assert_eq!(out.end["exitCode"], 0);
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
}

#[test]
fn keepalives_flow_while_a_process_is_idle_and_envs_and_cwd_apply() {
    let agent = TestAgent::start("keepalive-ping");
    let go = agent.dir.join("go-keepalive");
    let script = format!(
        "echo $AIRLOCK_TEST_BASE $EXTRA $(pwd); while [ ! -e '{go}' ]; do sleep 0.02; done",
        go = go.display()
    );
    let mut conn = agent.connect();
    let request = json!({"process": {"cmd": "/bin/bash", "args": ["-c", script], "envs": {"EXTRA": "x y"}, "cwd": "~"}});
    let mut stream = conn.open_stream(
        "process.Process/Start",
        &request,
        &[("Keepalive-Ping-Interval", "1")],
    );
    start_pid(&mut stream);
    let home = agent.home();
    read_until(&mut stream, &format!("base-value x y {}\n", home.display()));
    loop {
        let message = stream.message();
        if message["event"].get("keepalive").is_some() {
            break;
        }
    }
    std::fs::write(&go, b"").unwrap();
    assert_eq!(collect(&mut stream).end["exitCode"], 0);
}

#[test]
fn a_basic_auth_user_runs_the_process_as_that_user() {
    // The suite runs as root, which may switch users; inside a sandbox the kernel refuses and
    // the agent answers permission_denied instead.
    let agent = TestAgent::start("user");
    let mut conn = agent.connect();
    let auth = format!("Basic {}", b64(b"nobody:"));
    let mut stream = conn.open_stream(
        "process.Process/Start",
        &bash("id -u; echo $USER"),
        &[("Authorization", auth.as_str())],
    );
    start_pid(&mut stream);
    let out = collect(&mut stream);
    let nobody_uid = std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("nobody:x:")
                .map(|r| r.split(':').next().unwrap().to_string())
        })
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{nobody_uid}\nnobody\n")
    );

    let auth = format!("Basic {}", b64(b"no-such-user-xyz:"));
    let mut stream = conn.open_stream(
        "process.Process/Start",
        &bash("true"),
        &[("Authorization", auth.as_str())],
    );
    let end = stream.end_frame();
    assert_eq!(end["error"]["code"], "unauthenticated");
    assert!(
        end["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-user-xyz"),
        "{end}"
    );
}
