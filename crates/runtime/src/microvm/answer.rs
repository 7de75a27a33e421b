//! Reading an HTTP/1.1 answer of a guest's agent by its own framing (`Content-Length` or
//! chunks): the caller stops reading when it is whole and closes the connection itself, so
//! an answer never depends on how the far side's close travels back through the VMM's vsock.

/// Why an answer cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("the agent's answer has no status line: {0}")]
    NoStatus(String),
    #[error("the agent's answer has a bad Content-Length `{0}`")]
    BadLength(String),
    #[error("the agent's answer has neither a length nor chunks: {0}")]
    NoFraming(String),
}

/// The status and body of `answer` once it holds a whole response; `None` while it does not.
pub fn complete(answer: &[u8]) -> Result<Option<(u16, Vec<u8>)>, AnswerError> {
    let Some(split) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| AnswerError::NoStatus(head.clone()))?;
    let body = &answer[split + 4..];
    let header = |name: &str| {
        head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    };
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return Ok(dechunk(body).map(|body| (status, body)));
    }
    let length: usize = match header("content-length") {
        Some(text) => text.parse().map_err(|_| AnswerError::BadLength(text))?,
        None if status == 204 || status == 304 => 0,
        None => return Err(AnswerError::NoFraming(head)),
    };
    Ok((body.len() >= length).then(|| (status, body[..length].to_vec())))
}

/// The body of a chunked answer, `None` while it is not all there yet.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]).into_owned();
        // A size line that is not hex never completes: the caller's bound ends the read.
        let size = usize::from_str_radix(size_text.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_complete_waits_for_the_whole_answer_by_its_framing() {
        let chunked: &[u8] =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(complete(chunked).unwrap(), Some((200, b"abcde".to_vec())));
        assert_eq!(complete(&chunked[..chunked.len() - 7]).unwrap(), None);
        let sized: &[u8] = b"HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\nnope";
        assert_eq!(complete(sized).unwrap(), Some((404, b"nope".to_vec())));
        assert_eq!(complete(&sized[..sized.len() - 1]).unwrap(), None);
        assert_eq!(
            complete(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap(),
            Some((204, Vec::new()))
        );
        assert!(complete(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(complete(b"SSH-2.0\r\n\r\n").is_err());
    }
}
