//! The egress relay of a one-shot sandbox, run by its init: in `proxy` network mode the
//! sandbox's network namespace has only loopback, and the workload reaches the egress proxy at
//! `127.0.0.1:<port>` (what `HTTP_PROXY` names). Init listens there and carries each connection,
//! byte for byte, to the proxy's Unix socket, which the view shows under `/run/airlock/egress`.
//! It decides nothing: the proxy, outside the sandbox, enforces the policy. (A long-lived
//! sandbox's agent runs the same relay; see `airlock_agent::relay`.)

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Connections relayed at once; each costs two threads in the sandbox's pids budget.
const MAX_CONNECTIONS: usize = 128;

/// Binds the relay's port. Call in the sandbox's network namespace, before the workload starts,
/// so that its first connection finds the port open.
pub fn bind(port: u16) -> io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port))
}

/// Relays in background threads for the rest of init's life. Call only after init's last
/// fork: a process that has threads must not fork without exec.
pub fn start(listener: TcpListener, socket: PathBuf) -> io::Result<()> {
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("egress-relay".into())
        .spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(proxy) = UnixStream::connect(&socket) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                active.fetch_add(1, Ordering::Relaxed);
                let active = active.clone();
                let _ = pipe_both_ways(client, proxy, move || {
                    active.fetch_sub(1, Ordering::Relaxed);
                });
            }
        })
        .map(drop)
}

/// Copies each direction in its own thread; `done` runs once both are finished.
fn pipe_both_ways(
    client: TcpStream,
    proxy: UnixStream,
    done: impl FnOnce() + Send + 'static,
) -> io::Result<()> {
    let (mut client_read, mut proxy_write) = (client.try_clone()?, proxy.try_clone()?);
    let upstream = std::thread::Builder::new().spawn(move || {
        let _ = io::copy(&mut client_read, &mut proxy_write);
        let _ = proxy_write.shutdown(Shutdown::Write);
    })?;
    std::thread::Builder::new().spawn(move || {
        let (mut proxy_read, mut client_write) = (proxy, client);
        let _ = io::copy(&mut proxy_read, &mut client_write);
        let _ = client_write.shutdown(Shutdown::Write);
        let _ = upstream.join();
        done();
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn test_relay_carries_bytes_both_ways() {
        let dir = std::env::temp_dir().join(format!("airlock-relay-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("proxy.sock");
        let proxy = UnixListener::bind(&socket).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        start(listener, socket).unwrap();
        let echo = std::thread::spawn(move || {
            let (mut conn, _) = proxy.accept().unwrap();
            let mut request = [0u8; 5];
            conn.read_exact(&mut request).unwrap();
            conn.write_all(b"got ").unwrap();
            conn.write_all(&request).unwrap();
        });
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        client.write_all(b"hello").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, "got hello");
        echo.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
