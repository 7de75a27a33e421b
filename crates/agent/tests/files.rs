//! Byte-level tests of `/files`, `/health`, `filesystem.Filesystem` and the watchers against
//! the real binary.

#[cfg(test)]
mod common;

use common::{Body, TestAgent, path_str};
use serde_json::{Value, json};

fn multipart(boundary: &str, parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (filename, data) in parts {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

/// Form-encodes a query value as httpx does (space as `+`).
fn form(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        match b {
            b' ' => out.push('+'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn get_file(conn: &mut common::Conn, path: &str) -> (u16, Vec<u8>) {
    conn.send(
        "GET",
        &format!("/files?path={}", form(path)),
        &[],
        Body::None,
    );
    let (head, body) = conn.response();
    (head.status, body)
}

#[test]
fn health_answers_204() {
    let agent = TestAgent::start("health");
    let mut conn = agent.connect();
    conn.send("GET", "/health", &[], Body::None);
    let (head, body) = conn.response();
    assert_eq!((head.status, body.len()), (204, 0));
}

#[test]
fn multipart_upload_round_trips_a_name_with_spaces_and_plus() {
    let agent = TestAgent::start("multipart");
    let mut conn = agent.connect();
    let target = agent.dir.join("new dir/a b+c &%é.txt");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let body = multipart("----boundary42", &[(path_str(&target), &data)]);
    conn.send(
        "POST",
        &format!("/files?path={}", form(path_str(&target))),
        &[(
            "Content-Type",
            "multipart/form-data; boundary=----boundary42",
        )],
        Body::Chunked(body.chunks(4096).collect()),
    );
    let (head, reply) = conn.response();
    assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&reply));
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(
        reply,
        json!([{"path": path_str(&target), "name": "a b+c &%é.txt", "type": "file"}])
    );
    assert_eq!(std::fs::read(&target).unwrap(), data);
    let (status, read_back) = get_file(&mut conn, path_str(&target));
    assert_eq!(status, 200);
    assert!(read_back == data);
}

#[test]
fn multipart_with_several_files_uses_each_filename_as_the_path() {
    let agent = TestAgent::start("multipart-many");
    let mut conn = agent.connect();
    let a = agent.dir.join("one.txt");
    let body = multipart(
        "XyZ",
        &[
            (path_str(&a), b"first"),
            ("sub/two.txt", b"second\r\n--Xy-lookalike"),
        ],
    );
    conn.send(
        "POST",
        "/files",
        &[("Content-Type", "multipart/form-data; boundary=\"XyZ\"")],
        Body::Fixed(&body),
    );
    let (head, reply) = conn.response();
    assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&reply));
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    let two = agent.home().join("sub/two.txt");
    assert_eq!(reply[0]["path"], path_str(&a));
    assert_eq!(
        reply[1]["path"],
        path_str(&two),
        "relative names resolve against the home"
    );
    assert_eq!(std::fs::read(&a).unwrap(), b"first");
    assert_eq!(std::fs::read(&two).unwrap(), b"second\r\n--Xy-lookalike");
}

#[test]
fn octet_stream_upload_with_a_tilde_path_overwrites() {
    let agent = TestAgent::start("octet");
    let mut conn = agent.connect();
    for content in [&b"a much longer first version"[..], b"short"] {
        conn.send(
            "POST",
            "/files?path=~/deep/er/raw+file.bin",
            &[("Content-Type", "application/octet-stream")],
            Body::Chunked(content.chunks(3).collect()),
        );
        let (head, reply) = conn.response();
        assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&reply));
        let target = agent.home().join("deep/er/raw file.bin");
        let reply: Value = serde_json::from_slice(&reply).unwrap();
        assert_eq!(reply[0]["path"], path_str(&target));
        assert_eq!(std::fs::read(&target).unwrap(), content);
        assert_eq!(
            get_file(&mut conn, "~/deep/er/raw file.bin"),
            (200, content.to_vec())
        );
    }
    // A raw upload needs a path.
    conn.send(
        "POST",
        "/files",
        &[("Content-Type", "application/octet-stream")],
        Body::Fixed(b"data"),
    );
    assert_eq!(conn.response().0.status, 400);
}

#[test]
fn files_errors_have_the_right_statuses_and_a_refused_upload_closes_at_once() {
    let agent = TestAgent::start("files-errors");
    let mut conn = agent.connect();
    let (status, body) = get_file(&mut conn, "/nonexistent/file");
    assert_eq!(status, 404);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["code"], 404);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/file")
    );
    assert_eq!(
        get_file(&mut conn, path_str(&agent.dir)).0,
        400,
        "a directory"
    );
    conn.send("GET", "/files", &[], Body::None);
    assert_eq!(conn.response().0.status, 400, "no path");
    // Writing onto a directory fails at once: the answer names EISDIR and closes the
    // connection instead of reading a body that will not be written.
    let big = vec![7u8; 500_000];
    conn.send_cut_off(
        "POST",
        &format!("/files?path={}", form(path_str(&agent.dir))),
        &[("Content-Type", "application/octet-stream")],
        Body::Fixed(&big),
    );
    let (head, _) = conn.response();
    assert_eq!(head.status, 400);
    assert_eq!(head.header("airlock-errno"), Some("EISDIR"));
    assert_eq!(head.header("connection"), Some("close"));
    let mut conn = agent.connect();
    // A body read to its end keeps the connection, even when it fails.
    conn.send("POST", "/files", &[("Content-Type", "multipart/form-data; boundary=b")], Body::Fixed(b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/x\"\r\n\r\ntruncated"));
    let (head, _) = conn.response();
    assert_eq!(head.status, 400, "a truncated multipart body");
    assert_eq!(head.header("connection"), None);
    // A FIFO would block the agent's single thread on open: refused both ways.
    let fifo = agent.dir.join("fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(get_file(&mut conn, path_str(&fifo)).0, 400);
    conn.send_cut_off(
        "POST",
        &format!("/files?path={}", form(path_str(&fifo))),
        &[("Content-Type", "application/octet-stream")],
        Body::Fixed(b"x"),
    );
    assert_eq!(conn.response().0.status, 400);
    let mut conn = agent.connect();
    conn.send("GET", "/health", &[], Body::None);
    assert_eq!(conn.response().0.status, 204);
}

#[test]
fn list_dir_honours_depth_and_excludes_the_root() {
    let agent = TestAgent::start("listdir");
    let root = agent.dir.join("tree");
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::write(root.join("top.txt"), b"12345").unwrap();
    std::fs::write(root.join("a/inner.txt"), b"").unwrap();
    std::os::unix::fs::symlink(root.join("a"), root.join("link")).unwrap();
    let mut conn = agent.connect();
    let names = |reply: &Value| -> Vec<String> {
        let mut v: Vec<String> = reply["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    let root_s = path_str(&root);
    let depth1 = conn.ok(
        "filesystem.Filesystem/ListDir",
        &json!({"path": root_s, "depth": 1}),
    );
    assert_eq!(
        names(&depth1),
        [
            format!("{root_s}/a"),
            format!("{root_s}/link"),
            format!("{root_s}/top.txt")
        ]
    );
    let top = depth1["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "top.txt")
        .unwrap();
    assert_eq!(top["size"], "5", "int64 as a string");
    assert_eq!(top["type"], "FILE_TYPE_FILE");
    let link = depth1["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "link")
        .unwrap();
    assert_eq!(link["symlinkTarget"], format!("{root_s}/a"));

    let depth0 = conn.ok("filesystem.Filesystem/ListDir", &json!({"path": root_s}));
    assert_eq!(names(&depth0), names(&depth1), "depth 0 means 1");
    let depth2 = conn.ok(
        "filesystem.Filesystem/ListDir",
        &json!({"path": root_s, "depth": "2"}),
    );
    assert_eq!(
        names(&depth2),
        [
            format!("{root_s}/a"),
            format!("{root_s}/a/b"),
            format!("{root_s}/a/inner.txt"),
            format!("{root_s}/link"),
            format!("{root_s}/top.txt")
        ],
        "the symlinked directory is not followed"
    );
    let (status, err) = conn.unary(
        "filesystem.Filesystem/ListDir",
        &json!({"path": format!("{root_s}/top.txt")}),
    );
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (status, err) = conn.unary(
        "filesystem.Filesystem/ListDir",
        &json!({"path": format!("{root_s}/missing")}),
    );
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));
}

#[test]
fn make_dir_stat_move_and_remove() {
    let agent = TestAgent::start("fsops");
    let mut conn = agent.connect();
    let made = conn.ok("filesystem.Filesystem/MakeDir", &json!({"path": "~/x/y"}));
    let y = agent.home().join("x/y");
    assert_eq!(made["entry"]["path"], path_str(&y));
    assert_eq!(made["entry"]["type"], "FILE_TYPE_DIRECTORY");
    let (status, err) = conn.unary(
        "filesystem.Filesystem/MakeDir",
        &json!({"path": path_str(&y)}),
    );
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("already_exists"))
    );
    std::fs::write(y.join("f"), b"abc").unwrap();
    let (status, err) = conn.unary(
        "filesystem.Filesystem/MakeDir",
        &json!({"path": path_str(&y.join("f"))}),
    );
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_argument"))
    );

    let stat = conn.ok("filesystem.Filesystem/Stat", &json!({"path": "x/y/f"}));
    let entry = &stat["entry"];
    assert_eq!(
        (entry["name"].as_str(), entry["size"].as_str()),
        (Some("f"), Some("3"))
    );
    assert_eq!(entry["permissions"].as_str().unwrap().len(), 10);
    assert!(entry["modifiedTime"].as_str().unwrap().ends_with('Z'));
    let (status, err) = conn.unary("filesystem.Filesystem/Stat", &json!({"path": "~/nope"}));
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));

    let moved = conn.ok(
        "filesystem.Filesystem/Move",
        &json!({"source": "~/x/y/f", "destination": "~/new/parent/g"}),
    );
    let g = agent.home().join("new/parent/g");
    assert_eq!(moved["entry"]["path"], path_str(&g));
    assert_eq!(std::fs::read(&g).unwrap(), b"abc");
    assert!(!y.join("f").exists());
    let (status, err) = conn.unary(
        "filesystem.Filesystem/Move",
        &json!({"source": "~/x/y/f", "destination": "~/z"}),
    );
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));

    assert_eq!(
        conn.ok("filesystem.Filesystem/Remove", &json!({"path": "~/x"})),
        json!({})
    );
    assert!(!agent.home().join("x").exists(), "removal is recursive");
    conn.ok("filesystem.Filesystem/Remove", &json!({"path": "~/x"}));
    conn.ok(
        "filesystem.Filesystem/Remove",
        &json!({"path": path_str(&g)}),
    );
    assert!(!g.exists());
}

#[test]
fn a_polling_watcher_sees_a_created_file_in_a_subdirectory() {
    let agent = TestAgent::start("watcher");
    let dir = agent.dir.join("watched");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let mut conn = agent.connect();
    let created = conn.ok(
        "filesystem.Filesystem/CreateWatcher",
        &json!({"path": path_str(&dir), "recursive": true}),
    );
    let id = created["watcherId"].as_str().unwrap().to_string();
    std::fs::write(dir.join("sub/new.txt"), b"x").unwrap();
    let mut seen = Vec::new();
    // Bounded polling so a broken watcher fails instead of hanging (not a timing assertion).
    for _ in 0..3000 {
        let events = conn.ok(
            "filesystem.Filesystem/GetWatcherEvents",
            &json!({"watcher_id": id}),
        );
        seen.extend(events["events"].as_array().unwrap().iter().cloned());
        if seen
            .iter()
            .any(|e| e["name"] == "sub/new.txt" && e["type"] == "EVENT_TYPE_CREATE")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        seen.iter()
            .any(|e| e["name"] == "sub/new.txt" && e["type"] == "EVENT_TYPE_CREATE"),
        "{seen:?}"
    );
    conn.ok(
        "filesystem.Filesystem/RemoveWatcher",
        &json!({"watcherId": id}),
    );
    let (status, err) = conn.unary(
        "filesystem.Filesystem/GetWatcherEvents",
        &json!({"watcherId": id}),
    );
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));
    let (status, err) = conn.unary(
        "filesystem.Filesystem/CreateWatcher",
        &json!({"path": path_str(&dir.join("missing"))}),
    );
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));
}

#[test]
fn watch_dir_streams_start_then_events_including_new_subdirectories() {
    let agent = TestAgent::start("watchdir");
    let dir = agent.dir.join("watched");
    std::fs::create_dir_all(&dir).unwrap();
    let mut conn = agent.connect();
    let mut stream = conn.open_stream(
        "filesystem.Filesystem/WatchDir",
        &json!({"path": path_str(&dir), "recursive": true}),
        &[("Keepalive-Ping-Interval", "50")],
    );
    assert_eq!(stream.message(), json!({"start": {}}));
    std::fs::create_dir(dir.join("later")).unwrap();
    let wait_for = |stream: &mut common::BodyReader<'_>, name: &str| loop {
        let message = stream.message();
        if message.get("keepalive").is_some() {
            continue;
        }
        let event = &message["filesystem"];
        if event["name"] == name && event["type"] == "EVENT_TYPE_CREATE" {
            return;
        }
    };
    wait_for(&mut stream, "later");
    // The new subdirectory is watched too (there is a race between its creation and the
    // watch being added, so write the file only after its creation event was seen).
    std::fs::write(dir.join("later/file.txt"), b"x").unwrap();
    wait_for(&mut stream, "later/file.txt");
}

#[test]
fn test_resume_refuses_short_entropy_unknown_fields_and_bad_env_names() {
    let agent = TestAgent::start("resume-refusals");
    let mut conn = agent.connect();
    let short = common::b64(&[1u8; 8]);
    let long = common::b64(&[1u8; 64]);
    for (body, expected) in [
        (json!({"entropy_b64": short}), "32 to 4096 bytes"),
        (json!({"entropy_b64": "not base64!"}), "32 to 4096 bytes"),
        (json!({"entropy_b64": long, "seed": 1}), "unknown field"),
        (
            json!({"entropy_b64": long, "env": {"A=B": "x"}}),
            "not a valid environment variable",
        ),
        // A guest's egress: only the proxy's two trust files, and real ports.
        (
            json!({"entropy_b64": long, "egress": {"relay_port": 3128, "vsock_port": 3128,
                "files": {"../etc/passwd": "x"}}}),
            "egress.files may name ca.pem and ca-bundle.pem only",
        ),
        (
            json!({"entropy_b64": long, "egress": {"relay_port": 0, "vsock_port": 3128}}),
            "must not be 0",
        ),
        (
            json!({"entropy_b64": long, "egress": {"relay_port": 3128, "vsock_port": 3128,
                "socket": "/x"}}),
            "unknown field",
        ),
    ] {
        let text = body.to_string();
        conn.send(
            "POST",
            "/airlock/resume",
            &[("Content-Type", "application/json")],
            Body::Fixed(text.as_bytes()),
        );
        let (head, reply) = conn.response();
        let reply = String::from_utf8_lossy(&reply);
        assert_eq!(head.status, 400, "{text}: {reply}");
        assert!(reply.contains(expected), "{text}: {reply}");
    }
}
