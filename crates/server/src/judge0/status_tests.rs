use super::*;

const LIMITS: TimeLimits = TimeLimits {
    cpu_seconds: 1.0,
    wall_seconds: 3.0,
};

fn ending(exit: Exit) -> Ending {
    Ending {
        exit,
        killed_for_time: false,
        cpu_seconds: 0.1,
        wall_seconds: 0.2,
    }
}

fn status_of(ending: &Ending, expected: Option<&[u8]>, stdout: Option<&[u8]>) -> Status {
    run_status(&verdict(ending, &LIMITS), expected, stdout)
}

#[test]
fn test_statuses_are_judge0s_fourteen_in_order() {
    let ids: Vec<u8> = Status::ALL.iter().map(|s| s.id()).collect();
    assert_eq!(ids, (1..=14).collect::<Vec<u8>>());
    assert_eq!(Status::from_id(5), Some(Status::TimeLimitExceeded));
    assert_eq!(Status::from_id(15), None);
    assert_eq!(Status::Nzec.description(), "Runtime Error (NZEC)");
    assert_eq!(Status::ExecFormatError.description(), "Exec Format Error");
    assert!(Status::Processing.is_pending() && !Status::Accepted.is_pending());
}

#[test]
fn test_run_status_clean_exit_without_expected_output_is_accepted() {
    assert_eq!(
        status_of(&ending(Exit::Code(0)), None, Some(b"x")),
        Status::Accepted
    );
    assert_eq!(
        status_of(&ending(Exit::Code(0)), None, None),
        Status::Accepted
    );
}

#[test]
fn test_run_status_compares_after_trailing_whitespace_rules() {
    let ok = ending(Exit::Code(0));
    // Trailing spaces on a line, a missing or extra final newline, CRLF, trailing NULs.
    for (expected, actual) in [
        (&b"1 2\n3\n"[..], &b"1 2  \n3"[..]),
        (b"hello", b"hello\n\n\n"),
        (b"a\nb", b"a\r\nb\r\n"),
        (b"x", b"x\0 \t"),
    ] {
        assert_eq!(
            status_of(&ok, Some(expected), Some(actual)),
            Status::Accepted,
            "{expected:?} vs {actual:?}"
        );
    }
    // Leading whitespace, inner blank lines and case all count.
    for (expected, actual) in [
        (&b"x"[..], &b" x"[..]),
        (b"a\nb", b"a\n\nb"),
        (b"Yes", b"yes"),
    ] {
        assert_eq!(
            status_of(&ok, Some(expected), Some(actual)),
            Status::WrongAnswer,
            "{expected:?} vs {actual:?}"
        );
    }
}

#[test]
fn test_run_status_empty_output_against_empty_expected_is_wrong_answer() {
    // Judge0 stores an empty output as null, and null never equals "": kept as Judge0 has it.
    assert_eq!(
        status_of(&ending(Exit::Code(0)), Some(b""), None),
        Status::WrongAnswer
    );
    assert_eq!(
        status_of(&ending(Exit::Code(0)), Some(b"\n"), Some(b" ")),
        Status::Accepted
    );
}

#[test]
fn test_run_status_maps_signals_to_runtime_errors() {
    for (signal, status) in [
        (11, Status::SigSegv),
        (25, Status::SigXfsz),
        (8, Status::SigFpe),
        (6, Status::SigAbrt),
        (9, Status::OtherRuntimeError),
        (15, Status::OtherRuntimeError),
        (31, Status::OtherRuntimeError),
    ] {
        assert_eq!(
            status_of(&ending(Exit::Signal(signal)), Some(b"x"), Some(b"x")),
            status
        );
    }
    let verdict = verdict(&ending(Exit::Signal(11)), &LIMITS);
    assert_eq!(verdict.message(), Some("Caught fatal signal 11"));
}

#[test]
fn test_run_status_non_zero_exit_is_nzec_even_past_the_time_limit() {
    let mut failed = ending(Exit::Code(3));
    assert_eq!(status_of(&failed, None, None), Status::Nzec);
    failed.cpu_seconds = 5.0;
    let verdict = verdict(&failed, &LIMITS);
    assert_eq!(verdict.message(), Some("Exited with error status 3"));
    assert_eq!(run_status(&verdict, None, None), Status::Nzec);
}

#[test]
fn test_run_status_time_limits_give_tle() {
    let mut killed = ending(Exit::Signal(9));
    killed.killed_for_time = true;
    killed.cpu_seconds = 1.5;
    assert_eq!(status_of(&killed, None, None), Status::TimeLimitExceeded);
    assert_eq!(
        verdict(&killed, &LIMITS).message(),
        Some("Time limit exceeded")
    );
    // Killed by the wall clock while sleeping.
    let mut asleep = killed;
    asleep.cpu_seconds = 0.0;
    asleep.wall_seconds = 3.5;
    assert_eq!(
        verdict(&asleep, &LIMITS).message(),
        Some("Time limit exceeded (wall clock)")
    );
    // Finished cleanly within the extra time, but past the limit: still TLE (isolate).
    let mut slow = ending(Exit::Code(0));
    slow.cpu_seconds = 1.2;
    assert_eq!(
        status_of(&slow, Some(b"x"), Some(b"x")),
        Status::TimeLimitExceeded
    );
    // The RLIMIT_CPU backstop's signals on a program past its CPU limit.
    for signal in [9, 24] {
        let mut backstop = ending(Exit::Signal(signal));
        backstop.cpu_seconds = 2.5;
        assert_eq!(status_of(&backstop, None, None), Status::TimeLimitExceeded);
    }
    // SIGXCPU is the CPU limit's even when the figure came in a little under it.
    assert_eq!(
        status_of(&ending(Exit::Signal(24)), None, None),
        Status::TimeLimitExceeded
    );
}

#[test]
fn test_normalize_output_matches_ruby_rules() {
    assert_eq!(normalize_output(b"a  \nb\t\n\n"), b"a\nb");
    assert_eq!(normalize_output(b"  a"), b"  a");
    assert_eq!(normalize_output(b""), b"");
    assert_eq!(normalize_output(b"\n\n"), b"");
    assert_eq!(normalize_output(b"a\n\nb  "), b"a\n\nb");
    // Bytes that are not UTF-8 compare as bytes.
    assert_eq!(normalize_output(b"\xff \n"), b"\xff");
}

#[test]
fn test_signal_from_status_inverts_the_agents_wording() {
    assert_eq!(signal_from_status("signal: segmentation fault"), Some(11));
    assert_eq!(signal_from_status("signal: aborted (core dumped)"), Some(6));
    assert_eq!(signal_from_status("signal: killed"), Some(9));
    assert_eq!(
        signal_from_status("signal: file size limit exceeded"),
        Some(25)
    );
    assert_eq!(signal_from_status("signal: signal 40"), Some(40));
    assert_eq!(signal_from_status("exit status 1"), None);
    assert_eq!(signal_from_status("signal: nonsense"), None);
}
