//! The control line of a pre-created VM shell (`airlock-vmm restore --shell`). Such a VMM has
//! done everything a restore can do ahead: its VM, irqchip, PIT, vCPU and irqfds exist, the
//! snapshot's state is parsed and its memory file open, the disks and snapshot files are
//! open. The first connection on the agent's socket is then the owner's, which asks for the
//! restore; every later connection goes to the guest.
//!
//! The exchange, one line each way: `restore\n`, answered `restored <microseconds>\n` (the
//! time from the request to the vCPU state being in) or `error: <why>\n`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

/// The request.
pub const RESTORE: &str = "restore";
/// The longest request line read; anything longer is refused.
const LINE_LIMIT_BYTES: u64 = 64;

/// Why a shell's control exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("accepting the shell's control connection failed")]
    Accept(#[source] io::Error),
    #[error("reading the shell's control connection failed")]
    Read(#[source] io::Error),
    #[error("the shell's control connection closed before asking for the restore")]
    Closed,
    #[error("the shell's control connection asked {0:?}, not `restore`")]
    Unexpected(String),
    #[error("answering on the shell's control connection failed")]
    Answer(#[source] io::Error),
}

/// Waits for the first connection on `listener` and its `restore` line; returns the
/// connection, to answer on with [`answer`].
pub fn await_restore(listener: &UnixListener) -> Result<UnixStream, ControlError> {
    // Blocking: nothing else runs until the owner asks (the vsock thread starts later).
    listener
        .set_nonblocking(false)
        .map_err(ControlError::Accept)?;
    let (stream, _) = listener.accept().map_err(ControlError::Accept)?;
    let mut line = String::new();
    BufReader::new((&stream).take(LINE_LIMIT_BYTES))
        .read_line(&mut line)
        .map_err(ControlError::Read)?;
    if line.is_empty() {
        return Err(ControlError::Closed);
    }
    let asked = line.strip_suffix('\n').unwrap_or(&line);
    if asked != RESTORE || !line.ends_with('\n') {
        return Err(ControlError::Unexpected(asked.to_owned()));
    }
    Ok(stream)
}

/// Answers the restore: its duration, or why it failed.
pub fn answer(
    mut stream: UnixStream,
    restored: Result<Duration, &str>,
) -> Result<(), ControlError> {
    let line = match restored {
        Ok(took) => format!("restored {}\n", took.as_micros()),
        Err(why) => format!("error: {}\n", why.replace('\n', " ")),
    };
    stream
        .write_all(line.as_bytes())
        .map_err(ControlError::Answer)
}

/// The owner's side: asks the shell behind `stream` to restore and returns the time the VMM
/// took, or the shell's refusal as an error of kind `Other`.
pub fn request_restore(stream: &mut UnixStream) -> io::Result<Duration> {
    let mut line = String::new();
    // A shell that already ended refuses the write; its log says why, as for a silent close.
    let gone = |e: &io::Error| {
        matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        )
    };
    match stream.write_all(format!("{RESTORE}\n").as_bytes()) {
        Err(e) if !gone(&e) => return Err(e),
        Err(_) => {}
        Ok(()) => match BufReader::new(stream.take(4096)).read_line(&mut line) {
            Err(e) if !gone(&e) => return Err(e),
            _ => {}
        },
    }
    let line = line.trim_end();
    if let Some(micros) = line.strip_prefix("restored ") {
        let micros: u64 = micros.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the shell answered {line:?}"),
            )
        })?;
        return Ok(Duration::from_micros(micros));
    }
    let why = line.strip_prefix("error: ").unwrap_or(line);
    Err(io::Error::other(if why.is_empty() {
        "the shell ended without answering (its log says why)".to_owned()
    } else {
        why.to_owned()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (UnixListener, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "airlock-shell-control-{name}-{}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        (UnixListener::bind(&path).unwrap(), path)
    }

    #[test]
    fn test_control_restore_is_asked_and_answered_with_its_time() {
        let (listener, path) = pair("ok");
        let owner = std::thread::spawn({
            let path = path.clone();
            move || request_restore(&mut UnixStream::connect(path).unwrap())
        });
        let stream = await_restore(&listener).unwrap();
        answer(stream, Ok(Duration::from_micros(321))).unwrap();
        assert_eq!(owner.join().unwrap().unwrap(), Duration::from_micros(321));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn test_control_refusal_reaches_the_owner_as_its_reason() {
        let (listener, path) = pair("refused");
        let owner = std::thread::spawn({
            let path = path.clone();
            move || request_restore(&mut UnixStream::connect(path).unwrap())
        });
        let stream = await_restore(&listener).unwrap();
        answer(stream, Err("the shell has 1 virtio\ninterrupt lines")).unwrap();
        let err = owner.join().unwrap().unwrap_err();
        assert_eq!(err.to_string(), "the shell has 1 virtio interrupt lines");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn test_control_refuses_another_request_an_endless_line_and_a_silent_close() {
        let (listener, path) = pair("bad");
        for sent in [&b"boot\n"[..], &[b'r'; 200][..], b""] {
            let mut client = UnixStream::connect(&path).unwrap();
            client.write_all(sent).unwrap();
            drop(client);
            let err = await_restore(&listener).unwrap_err();
            match sent.len() {
                0 => assert!(matches!(err, ControlError::Closed), "{err}"),
                _ => assert!(matches!(err, ControlError::Unexpected(_)), "{err}"),
            }
        }
        // An owner whose shell died answers with the shell's log as the place to look.
        let mut client = UnixStream::connect(&path).unwrap();
        let (server, _) = listener.accept().unwrap();
        drop(server);
        let err = request_restore(&mut client).unwrap_err();
        assert!(err.to_string().contains("without answering"), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
