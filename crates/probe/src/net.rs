//! Network attacks (Unix sockets, UDP, DNS, ICMP, inbound listeners) and the fake remote
//! servers that the security evaluation runs in a network namespace of its own.

use std::io::{self, BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use crate::{Outcome, check};

/// Connects to a Unix socket: a path, or `@name` for an abstract one.
pub fn connect_unix(target: &str) -> Outcome {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
    match target.strip_prefix('@') {
        Some(name) => UnixStream::connect_addr(&UnixAddr::from_abstract_name(name.as_bytes())?)?,
        None => UnixStream::connect(target)?,
    };
    Ok(String::new())
}

fn socket_addr(text: &str) -> io::Result<SocketAddr> {
    text.parse()
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn udp_socket_for(target: &SocketAddr) -> io::Result<UdpSocket> {
    let local: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse()
    } else {
        "[::]:0".parse()
    }
    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let socket = UdpSocket::bind(local)?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    Ok(socket)
}

/// Sends one datagram to `target` and waits (2 s) for any answer: a round trip, so that a
/// datagram that vanished shows as a failure.
pub fn udp_echo(target: &str) -> Outcome {
    let target = socket_addr(target)?;
    let socket = udp_socket_for(&target)?;
    socket.connect(target)?;
    socket.send(b"airlock-probe")?;
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf)?;
    Ok(format!("reply {n}"))
}

/// A DNS query for `name` (type A) to `server`; reports the number of answers.
pub fn dns_query(server: &str, name: &str) -> Outcome {
    let target = socket_addr(server)?;
    let mut query = vec![0x13, 0x37, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        let len =
            u8::try_from(label.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        query.push(len);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    let socket = udp_socket_for(&target)?;
    socket.connect(target)?;
    socket.send(&query)?;
    let mut buf = [0u8; 1500];
    let n = socket.recv(&mut buf)?;
    if n < 12 {
        return Err(io::Error::from_raw_os_error(libc::EPROTO));
    }
    Ok(format!("answers={}", u16::from_be_bytes([buf[6], buf[7]])))
}

/// An ICMP echo request through an unprivileged ICMP datagram socket, and its reply (2 s).
pub fn icmp_ping(address: &str) -> Outcome {
    let ip: std::net::Ipv4Addr = address
        .parse()
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: socket takes integers; the descriptor is closed below.
    let fd = check(unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::IPPROTO_ICMP,
        )
        .into()
    })? as libc::c_int;
    let result = (|| {
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        // Echo request, code 0, checksum and id filled in by the kernel, sequence 1.
        let packet = [8u8, 0, 0, 0, 0, 0, 0, 1];
        // SAFETY: a local packet and a sockaddr_in with their sizes.
        check(unsafe {
            libc::sendto(
                fd,
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&raw const to).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ) as libc::c_long
        })?;
        let timeout = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: a timeval with its size.
        check(unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const timeout).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
            .into()
        })?;
        let mut buf = [0u8; 256];
        // SAFETY: a local buffer with its length.
        check(unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) as libc::c_long })?;
        Ok(String::from("reply"))
    })();
    // SAFETY: closing our own descriptor.
    unsafe { libc::close(fd) };
    result
}

/// Listens on `0.0.0.0:port` (a reverse-shell listener), prints `listening`, and waits up to
/// `seconds` for anyone to connect.
pub fn listen_wait(port: i64, seconds: i64) -> Outcome {
    let port = u16::try_from(port).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let listener = TcpListener::bind(("0.0.0.0", port))?;
    listener.set_nonblocking(true)?;
    println!("listening");
    io::stdout().flush()?;
    let deadline = Instant::now() + Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((_, peer)) => return Ok(format!("accepted {peer}")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ETIMEDOUT))
}

/// The target of a reach test: listens on TARGET (`127.0.0.1:PORT`, or `@NAME` for an abstract
/// Unix socket) until it has accepted COUNT connections or SECONDS have passed, and reports how
/// many it accepted.
pub fn hold_listener(target: &str, count: i64, seconds: i64) -> Outcome {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
    let mut accept: Box<dyn FnMut() -> io::Result<()>> = match target.strip_prefix('@') {
        Some(name) => {
            let listener =
                UnixListener::bind_addr(&UnixAddr::from_abstract_name(name.as_bytes())?)?;
            listener.set_nonblocking(true)?;
            Box::new(move || listener.accept().map(drop))
        }
        None => {
            let listener = TcpListener::bind(socket_addr(target)?)?;
            listener.set_nonblocking(true)?;
            Box::new(move || listener.accept().map(drop))
        }
    };
    let deadline = Instant::now() + Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    let mut accepted = 0;
    while accepted < count && Instant::now() < deadline {
        match accept() {
            Ok(()) => accepted += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(format!("accepted {accepted}"))
}

/// The fake remote servers: `tcp:ADDR:TAG` answers a fixed HTTP response, `dns:ADDR` answers
/// every A query with 198.51.100.7. Every connection and query is appended to `log` (one
/// line each), so that the suite can tell whether anything from a sandbox arrived. Prints
/// `ready` once every socket is bound, then serves until stdin closes.
pub fn fake_servers(log: &str, specs: &[String]) -> Outcome {
    let log = std::sync::Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?,
    ));
    let record = move |line: String| {
        if let Ok(mut file) = log.lock() {
            let _ = writeln!(file, "{line}");
            let _ = file.flush();
        }
    };
    for spec in specs {
        let record = record.clone();
        if let Some(rest) = spec.strip_prefix("tcp:") {
            let (addr, tag) = rest
                .rsplit_once(':')
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
            let listener = TcpListener::bind(socket_addr(addr)?)?;
            let tag = tag.to_owned();
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    let mut stream = stream;
                    let peer = stream
                        .peer_addr()
                        .map(|p| p.to_string())
                        .unwrap_or_default();
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
                    let mut buf = [0u8; 4096];
                    let n = stream.read(&mut buf).unwrap_or(0);
                    let first = String::from_utf8_lossy(&buf[..n]);
                    let first = first.lines().next().unwrap_or("");
                    record(format!("tcp {tag} from={peer} bytes={n} first={first:?}"));
                    let _ = stream
                        .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 14\r\n\r\nfake-metadata\n");
                }
            });
        } else if let Some(addr) = spec.strip_prefix("dns:") {
            let socket = UdpSocket::bind(socket_addr(addr)?)?;
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while let Ok((n, peer)) = socket.recv_from(&mut buf) {
                    let Some((name, end)) = parse_qname(&buf[..n]) else {
                        continue;
                    };
                    record(format!("dns name={name} from={peer}"));
                    let mut reply = buf[..end + 4].to_vec();
                    reply[2] = 0x81;
                    reply[3] = 0x80;
                    reply[6..8].copy_from_slice(&1u16.to_be_bytes());
                    reply.extend_from_slice(&[
                        0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 51, 100, 7,
                    ]);
                    let _ = socket.send_to(&reply, peer);
                }
            });
        } else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
    }
    println!("ready");
    io::stdout().flush()?;
    // Serve until the suite closes our stdin (or kills us).
    let mut line = String::new();
    while io::stdin().lock().read_line(&mut line).unwrap_or(0) > 0 {
        line.clear();
    }
    Ok(String::new())
}

/// The question name of a DNS query and the offset just past it.
fn parse_qname(packet: &[u8]) -> Option<(String, usize)> {
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*packet.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(packet.get(at..at + len)?).into_owned());
        at += len;
    }
    (packet.len() >= at + 4).then(|| (labels.join("."), at))
}

/// The proxy named by `$HTTP_PROXY` (`http://HOST:PORT`), connected.
fn connect_proxy() -> io::Result<std::net::TcpStream> {
    let proxy =
        std::env::var("HTTP_PROXY").map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))?;
    let address = proxy
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse::<SocketAddr>()
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    Ok(stream)
}

/// Reads a response head; returns `status=N error=CODE` (the proxy's `x-airlock-error`).
fn read_head(stream: &mut std::net::TcpStream) -> io::Result<(u16, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        if stream.read(&mut byte)? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EPROTO))?;
    let error = text
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("x-airlock-error")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| "-".into());
    Ok((status, error))
}

/// `GET url` through the proxy of `$HTTP_PROXY` (absolute form), with `Authorization:
/// Bearer $token_env` when a variable is named.
pub fn http_get(url: &str, token_env: &str) -> Outcome {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let host = rest.split('/').next().unwrap_or(rest);
    let mut stream = connect_proxy()?;
    let mut request = format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if !token_env.is_empty() {
        let token =
            std::env::var(token_env).map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))?;
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let (status, error) = read_head(&mut stream)?;
    Ok(format!("status={status} error={error}"))
}

/// `CONNECT target` through the proxy; once open, a TLS ClientHello naming `sni` (when given),
/// and whether anything came back before the proxy closed the tunnel.
pub fn proxy_connect(target: &str, sni: &str) -> Outcome {
    let mut stream = connect_proxy()?;
    stream.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())?;
    let (status, error) = read_head(&mut stream)?;
    if status != 200 || sni.is_empty() {
        return Ok(format!("status={status} error={error}"));
    }
    stream.write_all(&client_hello(sni))?;
    let mut buf = [0u8; 512];
    let then = match stream.read(&mut buf) {
        Ok(0) => "closed".to_owned(),
        Ok(n) => format!("data {n}"),
        Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(0)),
    };
    Ok(format!("status={status} then={then}"))
}

/// A TLS 1.3 ClientHello carrying `server_name`, with the extensions a TLS stack needs to
/// parse it (the key share is a fixed, made-up X25519 value: the handshake never completes).
fn client_hello(server_name: &str) -> Vec<u8> {
    let name = server_name.as_bytes();
    let len16 = |n: usize| u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes();
    let extension = |out: &mut Vec<u8>, kind: u16, data: &[u8]| {
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&len16(data.len()));
        out.extend_from_slice(data);
    };
    let mut sni = Vec::new();
    sni.extend_from_slice(&len16(name.len() + 3));
    sni.push(0);
    sni.extend_from_slice(&len16(name.len()));
    sni.extend_from_slice(name);
    let mut key_share = vec![0, 36, 0, 0x1d, 0, 32];
    key_share.extend_from_slice(&[0x42; 32]);
    let mut extensions = Vec::new();
    extension(&mut extensions, 0x0000, &sni);
    extension(&mut extensions, 0x000a, &[0, 2, 0, 0x1d]);
    extension(&mut extensions, 0x000d, &[0, 4, 0x08, 0x04, 0x04, 0x03]);
    extension(&mut extensions, 0x002b, &[2, 3, 4]);
    extension(&mut extensions, 0x0033, &key_share);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[0x5a; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&len16(extensions.len()));
    body.extend_from_slice(&extensions);
    let mut handshake = vec![1, 0];
    handshake.extend_from_slice(&len16(body.len()));
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 3, 1];
    record.extend_from_slice(&len16(handshake.len()));
    record.extend_from_slice(&handshake);
    record
}
